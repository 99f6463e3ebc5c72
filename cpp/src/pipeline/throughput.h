// The decode-only ceiling the loader is measured against: full-size decode of in-memory
// images on N threads, nothing else (no fetch, no transform, no batching).
#pragma once

#include <span>
#include <string>

#include "ddp/status.h"
#include "image/decode.h"

namespace ddp::pipeline {

// Decodes every blob `rounds` times over `num_threads` threads; returns images per second.
// Fails with the first decode error (naming the blob's position).
Result<double> DecodeThroughput(std::span<const std::string> blobs, int num_threads, int rounds = 1,
                                int scale_denom = 1);

}  // namespace ddp::pipeline
