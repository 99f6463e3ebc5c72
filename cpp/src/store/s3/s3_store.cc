#include "store/backends.h"

namespace ddp::store_internal {

Result<std::unique_ptr<Store>> OpenS3Store(std::string_view url, const StoreOptions& options) {
  return UnimplementedError("s3 store not built yet: '" + std::string(url) + "'");
}

}  // namespace ddp::store_internal
