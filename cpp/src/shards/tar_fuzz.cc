// libFuzzer target: arbitrary bytes as a tar shard through the parser, in both error
// modes and with a JSON label field. Errors are expected; a crash, sanitizer report or
// timeout is a bug, and so is a sample whose image lies outside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "shards/tar.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view tar(reinterpret_cast<const char*>(data), size);
  for (const bool skip : {false, true}) {
    for (const char* field : {"", "label"}) {
      auto r = ddp::shards::ParseTar(tar, "fuzz://shard.tar", {skip, field});
      if (!r.ok()) {
        if (skip) std::abort();  // skip_errors never fails: it drops the broken tail
        continue;
      }
      for (const auto& s : r->samples) {
        if (s.image_offset > size || s.image_size > size - s.image_offset) std::abort();
      }
    }
  }
  return 0;
}
