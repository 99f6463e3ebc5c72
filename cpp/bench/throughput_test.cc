#include "throughput.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "image/image_testutil.h"

namespace ddp::bench {
namespace {

using image::testing::EncodeJpeg;
using image::testing::EncodePng;
using image::testing::Pattern;

TEST(DecodeThroughput, DecodesEveryBlobOnEveryThread) {
  const std::vector<std::string> blobs = {EncodeJpeg(Pattern(64, 48), 64, 48, 3),
                                          EncodePng(Pattern(31, 17), 31, 17, 2)};
  for (int threads : {1, 3}) {
    Result<double> r = DecodeThroughput(blobs, threads, /*rounds=*/4);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(*r, 0.0);
  }
  const std::vector<std::string> jpeg = {blobs[0]};
  Result<double> scaled = DecodeThroughput(jpeg, 2, 2, /*scale_denom=*/8);
  ASSERT_TRUE(scaled.ok()) << scaled.status().ToString();
  EXPECT_GT(*scaled, 0.0);
}

TEST(DecodeThroughput, NamesTheBlobThatDoesNotDecode) {
  const std::vector<std::string> blobs = {EncodeJpeg(Pattern(16, 16), 16, 16, 3), "not an image"};
  Result<double> r = DecodeThroughput(blobs, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("blob #1"), std::string::npos) << r.status().ToString();
}

TEST(DecodeThroughput, RejectsNoThreadsOrRounds) {
  const std::vector<std::string> blobs = {EncodeJpeg(Pattern(16, 16), 16, 16, 3)};
  EXPECT_EQ(DecodeThroughput(blobs, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DecodeThroughput(blobs, 1, 0).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ddp::bench
