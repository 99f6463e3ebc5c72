// libFuzzer target: arbitrary bytes as a store URL through the parser and the redaction
// every message uses. Errors are expected; a crash, sanitizer report or timeout is a bug,
// and so is a redacted URL still holding the user info it had.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ddp/store.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view url(reinterpret_cast<const char*>(data), size);
  auto parsed = ddp::ParseStoreUrl(url);
  if (parsed.ok() && parsed->scheme.empty()) std::abort();
  parsed.status().IgnoreError();
  const std::string shown = ddp::RedactUrl(url);
  if (shown.size() > url.size()) std::abort();
  if (ddp::RedactUrl(shown) != shown) std::abort();  // idempotent: nothing left to remove
  return 0;
}
