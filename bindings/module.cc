// dask_ddp._core: the nanobind face of the C++ engine. One file per area; this file only
// calls their init functions (in this order: the stub lists names as they are defined,
// and TarShardLoader derives from ImageLoader).
#include <nanobind/nanobind.h>

#include "errors.h"

namespace nb = nanobind;

namespace ddp::py {
void init_storage(nb::module_& m);
void init_image(nb::module_& m);
void init_loader(nb::module_& m);
void init_shards(nb::module_& m);
void init_table(nb::module_& m);
}  // namespace ddp::py

NB_MODULE(_core, m) {
  m.doc() = "C++ engine of dask-ddp: object stores, image decode and the batch loader.";
  ddp::py::init_errors(m);
  ddp::py::init_storage(m);
  ddp::py::init_image(m);
  ddp::py::init_loader(m);
  ddp::py::init_shards(m);
  ddp::py::init_table(m);
}
