#include "ddp/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <string>

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

TEST(StatusTest, ErrnoErrorNamesThePathAndTheCall) {
  Status s = ErrnoError(ENOENT, "open", "/data/x.rec");
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), std::string("/data/x.rec: open: ") + std::strerror(ENOENT));
  EXPECT_EQ(ErrnoError(EACCES, "open", "p").code(), Code::kPermissionDenied);
  EXPECT_EQ(ErrnoError(EROFS, "write", "p").code(), Code::kPermissionDenied);
  EXPECT_EQ(ErrnoError(ENOSPC, "reserve 4096 bytes", "p").code(), Code::kResourceExhausted);
  EXPECT_EQ(ErrnoError(EFBIG, "write", "p").code(), Code::kResourceExhausted);
  EXPECT_EQ(ErrnoError(EIO, "read", "p").code(), Code::kDataLoss);
  EXPECT_EQ(ErrnoError(EEXIST, "link", "p").code(), Code::kFailedPrecondition);
  EXPECT_TRUE(ErrnoError(EINTR, "read", "p").IsTransient());
  EXPECT_EQ(ErrnoError(EBADF, "close", "p").code(), Code::kInternal);
}

}  // namespace
}  // namespace ddp
