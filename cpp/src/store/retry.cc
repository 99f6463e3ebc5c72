#include "store/retry.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace ddp::store_internal {

bool IsRetryableHttpStatus(long http_status) {
  switch (http_status) {
    case 429:
    case 500:
    case 502:
    case 503:
    case 504: return true;
    default: return false;
  }
}

bool IsRetryableS3Error(long http_status, std::string_view code) {
  // botocore's standard retry mode: its transient and throttling error codes.
  static constexpr std::string_view kRetryableCodes[] = {
      "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete",
      "InternalError", "InternalFailure", "ServiceUnavailable", "SlowDown", "Throttling",
      "ThrottlingException", "ThrottledException", "RequestThrottledException",
      "TooManyRequestsException", "ProvisionedThroughputExceededException",
      "TransactionInProgressException", "RequestLimitExceeded", "BandwidthLimitExceeded",
      "LimitExceededException", "RequestThrottled", "EC2ThrottledException",
      "IDPCommunicationError"};
  if (code == "RequestTimeTooSkewed") return false;
  for (std::string_view c : kRetryableCodes) {
    if (code == c) return true;
  }
  return IsRetryableHttpStatus(http_status);
}

bool IsExpiredCredentialsCode(std::string_view code) {
  return code == "ExpiredToken" || code == "ExpiredTokenException";
}

double BackoffSeconds(int retry, const RetryOptions& options, double uniform01) {
  if (retry < 1) return 0.0;
  // Cap the exponent so the power cannot overflow before the min() applies.
  double ceiling = options.initial_backoff_s * std::ldexp(1.0, std::min(retry - 1, 60));
  ceiling = std::min(ceiling, options.max_backoff_s);
  return std::clamp(uniform01, 0.0, 1.0) * std::max(ceiling, 0.0);
}

double RandomUnit() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

Status ValidateRetryOptions(const RetryOptions& options) {
  if (options.max_attempts < 1) {
    return InvalidArgumentError("max_attempts must be >= 1, got " +
                                std::to_string(options.max_attempts));
  }
  if (!(options.initial_backoff_s >= 0) || !(options.max_backoff_s >= 0)) {
    return InvalidArgumentError("back-off times must be >= 0 seconds");
  }
  return Status::Ok();
}

}  // namespace ddp::store_internal
