// libFuzzer target: arbitrary bytes through the .npy parser. Errors are expected; a
// crash, sanitizer report or timeout is a bug, and so is an accepted array whose data
// does not fit the input or whose size disagrees with its shape and dtype.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "shards/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto r = ddp::shards::ParseNpy(bytes, "fuzz://shard.tar#x.npy");
  if (!r.ok()) return 0;
  if (r->data_offset > size || r->data_size != size - r->data_offset) std::abort();
  if (static_cast<uint64_t>(r->elements()) * static_cast<uint64_t>(r->itemsize) != r->data_size) std::abort();
  return 0;
}
