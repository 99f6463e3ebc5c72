// Retry policy shared by the network back-ends: which failures are retried and how
// long to wait before the next attempt.
#pragma once

#include <cstdint>
#include <random>
#include <string_view>

#include "ddp/store.h"

namespace ddp::store_internal {

// HTTP answers worth retrying, as AWS's "standard" retry mode has them: 500, 502, 503,
// 504, and 429 (throttling by servers other than S3, whose throttling is 503 SlowDown).
// Never any other 4xx, nor 501/505: those fail the same way again.
bool IsRetryableHttpStatus(long http_status);

// An S3 (or STS) error answer worth retrying, from its HTTP status and the <Code> of its
// XML body (empty if none): the transient codes (RequestTimeout, which S3 sends as HTTP
// 400 when a request body stalls; InternalError; PriorRequestNotComplete) and the
// throttling codes (SlowDown, Throttling, RequestLimitExceeded, ...) whatever their
// status, else IsRetryableHttpStatus. RequestTimeTooSkewed is not retried: the clock
// is wrong and stays wrong.
bool IsRetryableS3Error(long http_status, std::string_view code);

// S3/STS error codes meaning the (temporary) credentials ran out, so fresh ones may work.
bool IsExpiredCredentialsCode(std::string_view code);

// The delay before retry number `retry` (1 for the first retry) under "full jitter":
// uniform in [0, min(max_backoff, initial_backoff * 2^(retry-1))]. Jitter keeps many
// clients throttled at once from retrying in lock-step. `uniform01` is in [0, 1).
double BackoffSeconds(int retry, const RetryOptions& options, double uniform01);

// A thread-safe source of jitter.
double RandomUnit();

// Checks retry options are usable; names the bad field.
Status ValidateRetryOptions(const RetryOptions& options);

}  // namespace ddp::store_internal
