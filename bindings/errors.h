// The one place that maps engine status codes to Python exceptions.
#pragma once

#include <nanobind/nanobind.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "ddp/status.h"

namespace ddp::py {

// Thrown by binding code for a non-OK Status; translated to a Python exception by code
// (see errors.cc for the table). Safe to throw with the GIL released.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status s) : std::runtime_error(s.ToString()), status_(std::move(s)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

inline void ThrowIfError(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

template <typename T>
T ValueOrThrow(Result<T>&& r) {
  if (!r.ok()) throw StatusError(r.status());
  return std::move(r).value();
}

// Translates StatusError to the Python exception of its code, in every module that
// registers it (dask_ddp._core, and the benchmark module dask_ddp_bench).
void RegisterStatusTranslator();

// The translator, and _raise_status (for tests of the mapping).
void init_errors(nanobind::module_& m);

}  // namespace ddp::py
