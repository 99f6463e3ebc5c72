#include "store/backends.h"

namespace ddp::store_internal {

Result<std::unique_ptr<Store>> OpenHttpStore(std::string_view url, const StoreOptions& options) {
  return UnimplementedError("http store not built yet: '" + std::string(url) + "'");
}

}  // namespace ddp::store_internal
