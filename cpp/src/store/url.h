// Store URLs: the one parser of the engine (OpenStore, the bindings and, through
// dask_ddp.storage.parse_url, the Python side all use it), the table of back-ends by
// scheme, and the redaction of credentials for messages and logs.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ddp/store.h"

namespace ddp::store_internal {

// Opens a back-end on a parsed URL's location (see StoreUrl::location).
using StoreOpener = Result<std::unique_ptr<Store>> (*)(std::string_view location,
                                                       const StoreOptions& options);

struct Backend {
  std::string_view scheme;  // lower case, without "://"
  StoreOpener open;
  bool local;  // reads the local file system (each loader thread reads its own file)
};

// Every back-end, by scheme: file, memory, s3, http, https.
std::span<const Backend> Backends();

// The back-end registered for `scheme` (lower case), or nullptr.
const Backend* FindBackend(std::string_view scheme);

}  // namespace ddp::store_internal
