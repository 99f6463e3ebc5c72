#include "ddp/store.h"

#include "store/url.h"

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
  DDP_ASSIGN_OR_RETURN(StoreUrl parsed, ParseStoreUrl(url));
  const store_internal::Backend* backend = store_internal::FindBackend(parsed.scheme);
  if (backend == nullptr) return InternalError("no back-end for scheme '" + parsed.scheme + "'");
  return backend->open(parsed.location, options);
}

}  // namespace ddp
