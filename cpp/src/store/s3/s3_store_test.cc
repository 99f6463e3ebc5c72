// The s3:// back-end: the conformance suite against a live S3 server when
// DDP_TEST_S3_ENDPOINT and DDP_TEST_S3_BUCKET are set (tests/storage/test_s3.py runs
// this binary against moto). The configuration's tests are in s3_config_test.cc.
#include <cstdlib>

#include "ddp/store.h"
#include "store/conformance_testutil.h"
#include "store/s3/s3_config.h"

namespace ddp {
namespace {

using ::ddp::testing::StoreConformanceTest;
using ::ddp::testing::StoreFactory;
using ::ddp::testing::StorePair;

Result<StorePair> OpenLiveS3(const std::string& unique) {
  const char* endpoint = std::getenv("DDP_TEST_S3_ENDPOINT");
  const char* bucket = std::getenv("DDP_TEST_S3_BUCKET");
  if (endpoint == nullptr || bucket == nullptr) {
    return FailedPreconditionError(
        "no live server: set DDP_TEST_S3_ENDPOINT and DDP_TEST_S3_BUCKET to run these");
  }
  StoreOptions o;
  o.endpoint_url = endpoint;
  o.retry.initial_backoff_s = 0.01;
  o.multipart_threshold = 5 << 20;  // LargeObjectRoundTrips (6 MiB) goes multipart
  o.multipart_part_size = 5 << 20;
  DDP_ASSIGN_OR_RETURN(auto s, OpenStore("s3://" + std::string(bucket) + "/" + unique, o));
  return StorePair{std::move(s), nullptr};
}

INSTANTIATE_TEST_SUITE_P(S3, StoreConformanceTest,
                         ::testing::Values(StoreFactory{"live", OpenLiveS3}),
                         ::ddp::testing::StoreFactoryName);

}  // namespace
}  // namespace ddp
