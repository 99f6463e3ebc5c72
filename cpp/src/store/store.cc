#include "ddp/store.h"

#include <algorithm>
#include <cctype>

#include "store/backends.h"

namespace ddp {

std::string Store::KeyUrl(std::string_view key) const {
  std::string u = url();
  if (key.empty()) return u;
  if (!u.empty() && u.back() != '/') u += '/';
  u += key;
  return u;
}

Status Store::GetMany(std::span<const std::string> keys, const GetCallback& cb, int max_in_flight) {
  static const std::atomic<bool> never{false};
  return GetManyCancellable(keys, cb, max_in_flight, never);
}

Status Store::GetManyCancellable(std::span<const std::string> keys, const GetCallback& cb,
                                 int max_in_flight, const std::atomic<bool>& cancel) {
  // Generic fallback: one request at a time. Network stores override this.
  for (size_t i = 0; i < keys.size(); ++i) {
    if (cancel.load(std::memory_order_relaxed)) {
      for (size_t j = i; j < keys.size(); ++j) {
        cb(j, CancelledError(KeyUrl(keys[j]) + ": cancelled"));
      }
      return CancelledError("batched get from " + url() + " cancelled");
    }
    cb(i, Get(keys[i]));
  }
  return Status::Ok();
}

Result<std::unique_ptr<Store>> OpenStore(std::string_view url, const StoreOptions& options) {
  using namespace store_internal;
  if (url.empty()) return InvalidArgumentError("empty store URL");
  size_t sep = url.find("://");
  if (sep == std::string_view::npos) return OpenFileStore(url, options);  // a plain path
  std::string scheme(url.substr(0, sep));
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string_view rest = url.substr(sep + 3);
  if (scheme == "file") {
    // file:///abs/path or file://localhost/abs/path; anything else names a remote host.
    if (rest.starts_with("localhost/")) rest.remove_prefix(9);
    if (!rest.starts_with("/")) {
      return InvalidArgumentError("file URL '" + std::string(url) +
                                  "' must be file:///absolute/path (or a plain path)");
    }
    return OpenFileStore(rest, options);
  }
  if (scheme == "memory") return OpenMemoryStore(rest, options);
  if (scheme == "s3") return OpenS3Store(url, options);
  if (scheme == "http" || scheme == "https") return OpenHttpStore(url, options);
  return InvalidArgumentError("unsupported URL scheme '" + scheme + "' in '" + std::string(url) +
                              "' (supported: file://, plain paths, s3://, http://, https://, "
                              "memory://)");
}

}  // namespace ddp
