// dask_ddp_bench: benchmark helpers for benchmarks/*.py, kept out of dask_ddp._core so
// the wheel ships none of them. `make build` puts it in the build tree (build/dev/bench),
// where benchmarks/bench_loader.py finds it; it is never installed.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "throughput.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

double DecodeThroughput(const std::vector<nb::bytes>& blobs, int num_threads, int rounds, int scale_denom) {
  std::vector<std::string> copies;
  copies.reserve(blobs.size());
  for (const nb::bytes& b : blobs) copies.emplace_back(b.c_str(), b.size());
  ddp::Result<double> r = [&] {
    nb::gil_scoped_release release;
    return ddp::bench::DecodeThroughput(copies, num_threads, rounds, scale_denom);
  }();
  return ddp::py::ValueOrThrow(std::move(r));
}

}  // namespace

NB_MODULE(dask_ddp_bench, m) {
  m.doc() = "Benchmark helpers of dask-ddp (development builds only; not in the wheel).";
  ddp::py::RegisterStatusTranslator();  // engine errors raise as from dask_ddp._core
  m.def("decode_throughput", &DecodeThroughput, "blobs"_a, "num_threads"_a, "rounds"_a = 1, "scale_denom"_a = 1,
        "Images per second of full-size decode only (no fetch, no transform) on N threads.");
}
