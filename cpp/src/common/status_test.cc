#include "ddp/status.h"

#include <gtest/gtest.h>

namespace ddp {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgumentError("odd value " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  DDP_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST(StatusTest, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, CarriesCodeAndContext) {
  Status s = NotFoundError("s3://b/k: HTTP 404").WithContext("reading image");
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: reading image: s3://b/k: HTTP 404");
  EXPECT_FALSE(s.IsTransient());
  EXPECT_TRUE(UnavailableError("x").IsTransient());
}

TEST(ResultTest, PropagatesErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("odd value 3"), std::string::npos);
}

}  // namespace
}  // namespace ddp
