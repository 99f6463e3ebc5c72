// Bindings of the image pipeline (decode, transforms, Loader).
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace ddp::py {

void init_data(nb::module_& m) { (void)m; }

}  // namespace ddp::py
