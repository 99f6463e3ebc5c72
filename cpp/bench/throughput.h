// The decode-only ceiling the loader is measured against: full-size decode of in-memory
// images on N threads, nothing else (no fetch, no transform, no batching). A benchmark
// helper: built into the development module dask_ddp_bench (python/module.cc), never
// into the engine or the wheel.
#pragma once

#include <span>
#include <string>

#include "ddp/status.h"
#include "image/decode.h"

namespace ddp::bench {

// Decodes every blob `rounds` times over `num_threads` threads; returns images per second.
// Fails with the first decode error (naming the blob's position).
Result<double> DecodeThroughput(std::span<const std::string> blobs, int num_threads, int rounds = 1,
                                int scale_denom = 1);

}  // namespace ddp::bench
