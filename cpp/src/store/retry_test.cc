#include "store/retry.h"

#include <gtest/gtest.h>

namespace ddp::store_internal {
namespace {

TEST(RetryTest, RetriesServerErrorsAndThrottlingNeverOtherClientErrors) {
  for (long s : {500L, 502L, 503L, 504L, 429L}) EXPECT_TRUE(IsRetryableHttpStatus(s)) << s;
  for (long s : {200L, 206L, 400L, 401L, 403L, 404L, 409L, 412L, 416L, 501L, 505L}) {
    EXPECT_FALSE(IsRetryableHttpStatus(s)) << s;
  }
}

TEST(RetryTest, S3ErrorCodesAsAwsStandardRetries) {
  // S3 answers a stalled upload with HTTP 400 RequestTimeout: retried despite the 400.
  EXPECT_TRUE(IsRetryableS3Error(400, "RequestTimeout"));
  EXPECT_TRUE(IsRetryableS3Error(500, "InternalError"));
  EXPECT_TRUE(IsRetryableS3Error(503, "SlowDown"));
  EXPECT_TRUE(IsRetryableS3Error(503, "ServiceUnavailable"));
  EXPECT_TRUE(IsRetryableS3Error(400, "Throttling"));
  EXPECT_TRUE(IsRetryableS3Error(400, "RequestLimitExceeded"));
  EXPECT_TRUE(IsRetryableS3Error(400, "PriorRequestNotComplete"));
  EXPECT_TRUE(IsRetryableS3Error(400, "IDPCommunicationError"));  // STS web identity
  for (long s : {500L, 502L, 503L, 504L}) EXPECT_TRUE(IsRetryableS3Error(s, "")) << s;
  EXPECT_TRUE(IsRetryableS3Error(502, "SomethingNew"));
  // A skewed clock stays skewed; other client errors fail the same way again.
  EXPECT_FALSE(IsRetryableS3Error(403, "RequestTimeTooSkewed"));
  for (const char* code : {"AccessDenied", "NoSuchKey", "NoSuchBucket", "InvalidAccessKeyId",
                           "SignatureDoesNotMatch", "InvalidRequest", "EntityTooSmall",
                           "InvalidToken", "ExpiredToken", ""}) {
    for (long s : {400L, 403L, 404L, 409L}) EXPECT_FALSE(IsRetryableS3Error(s, code)) << code;
  }
  EXPECT_FALSE(IsRetryableS3Error(501, "NotImplemented"));
  EXPECT_TRUE(IsExpiredCredentialsCode("ExpiredToken"));
  EXPECT_TRUE(IsExpiredCredentialsCode("ExpiredTokenException"));
  EXPECT_FALSE(IsExpiredCredentialsCode("InvalidToken"));
  EXPECT_FALSE(IsExpiredCredentialsCode("RequestTimeTooSkewed"));
}

TEST(RetryTest, BackoffGrowsExponentiallyUpToTheCap) {
  RetryOptions o;
  o.initial_backoff_s = 0.1;
  o.max_backoff_s = 1.0;
  // With the jitter at its top the delay is the ceiling itself.
  EXPECT_DOUBLE_EQ(BackoffSeconds(1, o, 1.0), 0.1);
  EXPECT_DOUBLE_EQ(BackoffSeconds(2, o, 1.0), 0.2);
  EXPECT_DOUBLE_EQ(BackoffSeconds(3, o, 1.0), 0.4);
  EXPECT_DOUBLE_EQ(BackoffSeconds(4, o, 1.0), 0.8);
  EXPECT_DOUBLE_EQ(BackoffSeconds(5, o, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(BackoffSeconds(1000, o, 1.0), 1.0);  // no overflow
  EXPECT_DOUBLE_EQ(BackoffSeconds(0, o, 1.0), 0.0);
}

TEST(RetryTest, JitterSpreadsDelaysOverTheWholeInterval) {
  RetryOptions o;
  o.initial_backoff_s = 0.1;
  o.max_backoff_s = 10.0;
  EXPECT_DOUBLE_EQ(BackoffSeconds(3, o, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(BackoffSeconds(3, o, 0.5), 0.2);
  double lo = 1e9, hi = 0, sum = 0;
  constexpr int kN = 20000;
  for (int i = 0; i < kN; ++i) {
    double u = RandomUnit();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    double d = BackoffSeconds(3, o, u);
    lo = std::min(lo, d);
    hi = std::max(hi, d);
    sum += d;
  }
  EXPECT_LT(lo, 0.01);
  EXPECT_GT(hi, 0.39);
  EXPECT_NEAR(sum / kN, 0.2, 0.01);  // uniform on [0, 0.4]
}

TEST(RetryTest, ValidatesOptions) {
  RetryOptions o;
  EXPECT_TRUE(ValidateRetryOptions(o).ok());
  o.max_attempts = 0;
  Status s = ValidateRetryOptions(o);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("max_attempts"), std::string::npos);
}

}  // namespace
}  // namespace ddp::store_internal
