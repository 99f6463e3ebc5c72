// Conversions between Python values and engine types that several binding files share:
// transform ops as Python spells them, bytes as a view, and capsules that own a buffer
// handed to numpy or torch without a copy.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/status.h"
#include "image/transforms.h"

namespace ddp::py {

// A transform op as (name, parameters), made by dask_ddp.data.transforms (each class's
// _op()).
using OpSpec = std::pair<std::string, std::vector<double>>;

// The pipeline of `specs`; InvalidArgument names an unknown op or a wrong parameter count.
Result<image::Pipeline> MakePipeline(const std::vector<OpSpec>& specs, bool fixed_size = true);

// A capsule owning a heap copy of `value`; deleting the capsule destroys it.
template <typename T>
nanobind::capsule OwnerOf(T value) {
  return nanobind::capsule(new T(std::move(value)),
                           [](void* p) noexcept { delete static_cast<T*>(p); });
}

// A lent buffer: one-dimensional uint8 host memory (a pinned torch tensor's numpy view).
using LentArray = nanobind::ndarray<uint8_t, nanobind::ndim<1>, nanobind::c_contig,
                                    nanobind::device::cpu>;

// The engine keeps each lent array referenced while its pool may write or read it; the
// last reference can go on an engine thread, so it is dropped under the GIL (and left
// alone once the interpreter is gone).
inline std::shared_ptr<void> KeepAlive(const LentArray& array) {
  return std::shared_ptr<void>(new LentArray(array), [](void* p) {
    if (!nanobind::is_alive()) return;
    nanobind::gil_scoped_acquire gil;
    delete static_cast<LentArray*>(p);
  });
}

inline std::string_view View(const nanobind::bytes& b) { return {b.c_str(), b.size()}; }

}  // namespace ddp::py
