// Retry policy shared by the network back-ends: which failures are retried and how
// long to wait before the next attempt.
#pragma once

#include <cstdint>
#include <random>

#include "ddp/store.h"

namespace ddp::store_internal {

// HTTP answers worth retrying: 5xx and 429 (throttling by servers other than S3, whose
// throttling is 503 SlowDown). Never any other 4xx: those fail the same way again.
bool IsRetryableHttpStatus(long http_status);

// The delay before retry number `retry` (1 for the first retry) under "full jitter":
// uniform in [0, min(max_backoff, initial_backoff * 2^(retry-1))]. Jitter keeps many
// clients throttled at once from retrying in lock-step. `uniform01` is in [0, 1).
double BackoffSeconds(int retry, const RetryOptions& options, double uniform01);

// A thread-safe source of jitter.
double RandomUnit();

// Checks retry options are usable; names the bad field.
Status ValidateRetryOptions(const RetryOptions& options);

}  // namespace ddp::store_internal
