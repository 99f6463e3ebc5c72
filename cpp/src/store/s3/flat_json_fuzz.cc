// libFuzzer target: arbitrary bytes as a credential endpoint's JSON answer. Errors are
// the expected outcome; a crash, sanitizer report or timeout is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "store/s3/flat_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = ddp::store_internal::ParseFlatJsonObject(
      std::string_view(reinterpret_cast<const char*>(data), size));
  r.status().IgnoreError();
  return 0;
}
