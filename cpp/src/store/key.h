// Internal helpers shared by the store back-ends: key checks and byte-range resolution.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/store.h"

namespace ddp::store_internal {

// Checks a key is usable: not empty, no NUL byte, and, when `strict` (file stores, where
// keys become paths), no leading '/', no empty, "." or ".." segment and no '\\'.
Status ValidateKey(std::string_view key, std::string_view store_url, bool strict);

// The absolute [offset, offset + length) of `range` within an object of `size` bytes.
// An offset past the end is kOutOfRange; a length reaching past the end is clamped to
// the end (as S3 and HTTP do).
struct ResolvedRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};
Result<ResolvedRange> ResolveRange(const ByteRange& range, uint64_t size, std::string_view key_url);

// "bytes=0-99" style description of a range, for messages.
std::string DescribeRange(const ByteRange& range);

}  // namespace ddp::store_internal
