// Internal: the back-end factories OpenStore dispatches to by URL scheme.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ddp/store.h"

namespace ddp::store_internal {

// `path` is a local directory (absolute or relative); need not exist yet.
Result<std::unique_ptr<Store>> OpenFileStore(std::string_view path, const StoreOptions& options);
// `name` is the part after "memory://"; empty opens a fresh anonymous store.
Result<std::unique_ptr<Store>> OpenMemoryStore(std::string_view name, const StoreOptions& options);
// `url` is the full "s3://bucket[/prefix]".
Result<std::unique_ptr<Store>> OpenS3Store(std::string_view url, const StoreOptions& options);
// `url` is the full "http(s)://host[:port][/base]".
Result<std::unique_ptr<Store>> OpenHttpStore(std::string_view url, const StoreOptions& options);

}  // namespace ddp::store_internal
