#include "store/text.h"

#include <gtest/gtest.h>

namespace ddp::store_internal {
namespace {

TEST(TextTest, LowerIsAsciiOnly) {
  EXPECT_EQ(Lower("Content-Length"), "content-length");
  EXPECT_EQ(Lower("TRUE"), "true");
  EXPECT_EQ(Lower("\xC3\x89t\xC3\xA9"), "\xC3\x89t\xC3\xA9");  // UTF-8 bytes untouched
  EXPECT_EQ(Lower(""), "");
}

TEST(TextTest, TrimStripsWhitespaceAtBothEnds) {
  EXPECT_EQ(Trim("  value\r\n"), "value");
  EXPECT_EQ(Trim("\tkey = v \t"), "key = v");
  EXPECT_EQ(Trim(" \r\n "), "");
  EXPECT_EQ(Trim("inner  space"), "inner  space");
}

}  // namespace
}  // namespace ddp::store_internal
