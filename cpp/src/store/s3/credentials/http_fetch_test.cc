#include "store/s3/credentials/http_fetch.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "store/s3/credentials/credentials_testutil.h"

namespace ddp::store_internal {
namespace {

using testing::TempFile;
using testing::UnixSeconds;

TEST(CredentialParseTest, ContainerAndInstanceMetadataJson) {
  // ECS / EKS Pod Identity shape.
  auto c = ParseCredentialsJson(R"({"AccessKeyId": "ASIA1", "SecretAccessKey": "S1",
      "Token": "T1", "Expiration": "2026-11-22T03:00:00Z",
      "RoleArn": "arn:aws:iam::123456789012:role/x", "AccountId": "123456789012"})",
                                "container credentials at http://169.254.170.2/v2/x");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->access_key, "ASIA1");
  EXPECT_EQ(c->session_token, "T1");
  EXPECT_EQ(UnixSeconds(*c->expiration), 1795316400);
  // EC2 instance metadata shape.
  auto m = ParseCredentialsJson(R"({
    "Code" : "Success", "LastUpdated" : "2026-11-22T02:00:00Z", "Type" : "AWS-HMAC",
    "AccessKeyId" : "ASIA2", "SecretAccessKey" : "S2", "Token" : "T2",
    "Expiration" : "2026-11-22T08:00:00Z" })",
                                "imds");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->secret_key, "S2");
  EXPECT_EQ(UnixSeconds(*m->expiration), 1795316400 + 5 * 3600);
  // Long-lived keys without an expiry (a local agent) are fine.
  auto k = ParseCredentialsJson(R"({"AccessKeyId": "AK", "SecretAccessKey": "SK"})", "x");
  ASSERT_TRUE(k.ok());
  EXPECT_FALSE(k->expiration.has_value());
}

TEST(CredentialParseTest, BadJsonAnswersNeverQuoteTheBody) {
  struct Case {
    const char* json;
    Code code;
    const char* says;
  };
  for (const Case& c : {
           Case{R"({"AccessKeyId": "AK", "SecretAccessKey": "TOPSECRET)", Code::kDataLoss,
                "not a JSON object"},
           Case{R"({"Token": "TOPSECRET"})", Code::kDataLoss, "no AccessKeyId"},
           Case{R"({"Code": "AssumeRoleUnauthorizedAccess", "Message": "denied",
                  "SecretAccessKey": "TOPSECRET"})",
                Code::kUnauthenticated, "AssumeRoleUnauthorizedAccess"},
           Case{R"({"AccessKeyId": "AK", "SecretAccessKey": "TOPSECRET", "Expiration": "soon"})",
                Code::kDataLoss, "bad expiration time 'soon'"},
       }) {
    auto r = ParseCredentialsJson(c.json, "EC2 instance metadata at http://x");
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find("EC2 instance metadata at http://x"), std::string::npos);
    EXPECT_EQ(r.status().message().find("TOPSECRET"), std::string::npos);
  }
}

TEST(CredentialFetchTest, SecretFilesAreTrimmedAndErrorsNameThePath) {
  std::string path = TempFile("  token-value\n");
  auto token = ReadSecretFile(path, "web identity token file");
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(*token, "token-value");
  std::filesystem::remove(path);
  auto missing = ReadSecretFile(path, "web identity token file");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kUnauthenticated);
  EXPECT_NE(missing.status().message().find("web identity token file " + path), std::string::npos)
      << missing.status().ToString();
  std::string blank = TempFile(" \n\t");
  auto empty = ReadSecretFile(blank, "container authorization token file");
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find(blank + ": empty"), std::string::npos) << empty.status().ToString();
  std::filesystem::remove(blank);
}

TEST(CredentialFetchTest, AnswersAreShownWithoutTheSecretAndCut) {
  EXPECT_EQ(Shown("token abc was refused, abc", "abc"), "token <redacted> was refused, <redacted>");
  EXPECT_EQ(Shown("plain", ""), "plain");
  const std::string shown = Shown(std::string(1000, 'x'), "");
  EXPECT_LT(shown.size(), 400u);
  EXPECT_TRUE(shown.ends_with("...")) << shown;

  HttpResponse resp;
  resp.status = 503;
  resp.body = R"({"code": "Busy", "message": "try again, TOPSECRET"})";
  Status s = JsonAnswerError("container credentials at http://x", resp, "TOPSECRET");
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_EQ(s.message(), "container credentials at http://x: HTTP 503 Busy: try again, <redacted>");
  EXPECT_EQ(CodeForCredentialAnswer(429), Code::kUnavailable);
  EXPECT_EQ(CodeForCredentialAnswer(404), Code::kNotFound);
  EXPECT_EQ(CodeForCredentialAnswer(403), Code::kUnauthenticated);
}

TEST(CredentialFetchTest, EndpointsMustBeHttpAndNeverShowAPassword) {
  EXPECT_TRUE(CheckHttpUrl("https://sts.internal", "AWS_ENDPOINT_URL_STS").ok());
  Status bad = CheckHttpUrl("ftp://u:hunter2@host", "AWS_ENDPOINT_URL_STS");
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  EXPECT_NE(bad.message().find("AWS_ENDPOINT_URL_STS='ftp://host'"), std::string::npos) << bad.ToString();
  EXPECT_EQ(bad.message().find("hunter2"), std::string::npos) << bad.ToString();
  EXPECT_EQ(WithoutTrailingSlash("http://x//"), "http://x");
}

}  // namespace
}  // namespace ddp::store_internal
