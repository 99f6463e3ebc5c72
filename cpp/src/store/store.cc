#include "ddp/store.h"

namespace ddp {

std::string Store::KeyUrl(std::string_view key) const {
  std::string u = url();
  if (key.empty()) return u;
  if (!u.empty() && u.back() != '/') u += '/';
  u += key;
  return u;
}

Status Store::GetMany(std::span<const std::string> keys, const GetCallback& cb, int max_in_flight) {
  // Generic fallback: one request at a time. Network stores override this.
  for (size_t i = 0; i < keys.size(); ++i) cb(i, Get(keys[i]));
  return Status::Ok();
}

Result<std::unique_ptr<Store>> OpenStore(std::string_view url, const StoreOptions& options) {
  return UnimplementedError("no store back-end for URL '" + std::string(url) + "'");
}

}  // namespace ddp
