// Bindings of the object store (ddp/store.h).
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace ddp::py {

void init_storage(nb::module_& m) { (void)m; }

}  // namespace ddp::py
