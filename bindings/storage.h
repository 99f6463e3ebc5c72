// The Python handle of an engine store, shared by the storage and data bindings (the
// Loader reads through the very store a dataset opened, with all its options).
#pragma once

#include <memory>

#include "ddp/store.h"

namespace ddp::py {

// Shared ownership: a running get_many or a Loader keeps the store alive.
struct PyStore {
  std::shared_ptr<Store> store;
};

}  // namespace ddp::py
