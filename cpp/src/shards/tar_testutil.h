// Test helpers: tar archives built byte by byte (ustar headers with real checksums, pax
// extended headers, GNU long names), to test the parser on exactly the layouts tar
// writers produce and on broken ones.
#pragma once

#include <string>
#include <string_view>

namespace ddp::shards::testing {

// One ustar member: a 512-byte header then `data` padded to 512 bytes. A name longer
// than 100 bytes is split into the ustar prefix field at a '/'.
std::string TarMember(std::string_view name, std::string_view data, char type = '0');
// A pax extended header ('x') carrying `path`, then the member (with a short name).
std::string PaxMember(std::string_view path, std::string_view data);
// A GNU long-name ('L') member carrying `name`, then the member.
std::string GnuLongMember(std::string_view name, std::string_view data);
// The end-of-archive marker: two zero blocks.
std::string TarEnd();

}  // namespace ddp::shards::testing
