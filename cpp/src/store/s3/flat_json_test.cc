#include "store/s3/flat_json.h"

#include <gtest/gtest.h>

namespace ddp::store_internal {
namespace {

TEST(FlatJsonTest, ReadsTheContainerCredentialsShape) {
  auto m = ParseFlatJsonObject(R"({
    "AccessKeyId" : "ASIAEXAMPLE",
    "Expiration" : "2026-11-22T03:00:00Z",
    "RoleArn" : "arn:aws:iam::123456789012:role\/trainer",
    "SecretAccessKey" : "se\"cr\\et",
    "Token" : "tok\u00e9\ud83d\ude00",
    "AccountId": 123456789012, "Ok": true, "Nothing": null,
    "Nested": {"a": [1, 2, {"b": "c"}], "d": {}}, "List": []
  })");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->at("AccessKeyId"), "ASIAEXAMPLE");
  EXPECT_EQ(m->at("RoleArn"), "arn:aws:iam::123456789012:role/trainer");
  EXPECT_EQ(m->at("SecretAccessKey"), "se\"cr\\et");
  EXPECT_EQ(m->at("Token"), "tok\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(m->at("AccountId"), "123456789012");
  EXPECT_EQ(m->at("Ok"), "true");
  EXPECT_EQ(m->at("Nothing"), "");
  EXPECT_FALSE(m->contains("Nested"));  // containers are skipped
  EXPECT_FALSE(m->contains("List"));
  EXPECT_FALSE(m->contains("b"));
  EXPECT_EQ(m->size(), 8u);
  ASSERT_TRUE(ParseFlatJsonObject(" {} ").ok());
  EXPECT_EQ(ParseFlatJsonObject(R"({"n": -0.5e+3})")->at("n"), "-0.5e+3");
}

TEST(FlatJsonTest, RejectsMalformedDocumentsWithoutQuotingThem) {
  for (std::string_view bad :
       {"", "[]", "\"s\"", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{\"a\":1} x",
        "{\"a\":\"SECRET", "{\"a\":\"x\\q\"}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\\u12\"}",
        "{\"a\":01}", "{\"a\":1.}", "{\"a\":tru}", "{\"a\":\"line\nbreak\"}",
        "{\"a\":1,\"a\":2}", "{a:1}", "{\"a\":[1,]}", "{\"a\":{\"b\" 1}}"}) {
    auto m = ParseFlatJsonObject(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().code(), Code::kDataLoss) << bad;
    EXPECT_NE(m.status().message().find("at byte"), std::string::npos);
    EXPECT_EQ(m.status().message().find("SECRET"), std::string::npos);
  }
}

TEST(FlatJsonTest, BoundsNesting) {
  std::string deep = "{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}";
  auto m = ParseFlatJsonObject(deep);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("nesting"), std::string::npos);
  std::string ok = "{\"a\":" + std::string(20, '[') + std::string(20, ']') + "}";
  EXPECT_TRUE(ParseFlatJsonObject(ok).ok());
}

}  // namespace
}  // namespace ddp::store_internal
