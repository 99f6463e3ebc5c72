#include "store/s3/s3_xml.h"

#include <gtest/gtest.h>

namespace ddp::store_internal {
namespace {

TEST(S3XmlTest, ParsesAListPageWithContinuation) {
  constexpr std::string_view kXml = R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>p/a &amp; b.jpg</Key><Size>12</Size><ETag>"x"</ETag></Contents>
  <Contents><Key>p/c</Key><Size>0</Size></Contents>
  <NextContinuationToken>tok/+=</NextContinuationToken>
</ListBucketResult>)";
  auto page = ParseListObjectsV2(kXml, "s3://b/p/");
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "p/a & b.jpg");
  EXPECT_EQ(page->objects[0].size, 12u);
  EXPECT_EQ(page->objects[1].size, 0u);
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "tok/+=");
}

TEST(S3XmlTest, RejectsMalformedListingsNamingTheRequest) {
  for (std::string_view xml :
       {"not xml <", "<Other/>",
        "<ListBucketResult><Contents><Key>k</Key></Contents></ListBucketResult>",
        "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
        "<ListBucketResult><Contents><Key>k</Key><Size>1x</Size></Contents></ListBucketResult>"}) {
    auto page = ParseListObjectsV2(xml, "s3://bucket/list");
    ASSERT_FALSE(page.ok()) << xml;
    EXPECT_EQ(page.status().code(), Code::kDataLoss);
    EXPECT_NE(page.status().message().find("s3://bucket/list"), std::string::npos);
  }
}

TEST(S3XmlTest, ParsesErrorsAndUploadIds) {
  std::string code, message;
  EXPECT_TRUE(ParseS3Error(
      "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code><Message>gone</Message></Error>", &code,
      &message));
  EXPECT_EQ(code, "NoSuchKey");
  EXPECT_EQ(message, "gone");
  EXPECT_FALSE(ParseS3Error("<CompleteMultipartUploadResult/>", &code, &message));
  EXPECT_FALSE(ParseS3Error("", &code, &message));

  auto id = ParseUploadId(
      "<InitiateMultipartUploadResult><UploadId>abc-123</UploadId></InitiateMultipartUploadResult>",
      "w");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "abc-123");
  EXPECT_FALSE(ParseUploadId("<InitiateMultipartUploadResult/>", "w").ok());
}

TEST(S3XmlTest, BuildsCompleteMultipartBody) {
  EXPECT_EQ(CompleteMultipartXml({{1, "\"e1\""}, {2, "e&2"}}),
            "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>&quot;e1&quot;</ETag>"
            "</Part><Part><PartNumber>2</PartNumber><ETag>e&amp;2</ETag></Part>"
            "</CompleteMultipartUpload>");
}

}  // namespace
}  // namespace ddp::store_internal
