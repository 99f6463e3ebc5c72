#include "store/s3/credentials/web_identity.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "store/s3/credentials/credentials_testutil.h"

namespace ddp::store_internal {
namespace {

using testing::FakeEnv;
using testing::UnixSeconds;

constexpr char kStsAnswer[] = R"(<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:ml:trainer</SubjectFromWebIdentityToken>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::123456789012:assumed-role/trainer/dask-ddp-1</Arn>
      <AssumedRoleId>AROACLKWSDQRAOEXAMPLE:dask-ddp-1</AssumedRoleId>
    </AssumedRoleUser>
    <Credentials>
      <SessionToken>FwoGZXIvYXdzEXAMPLETOKEN</SessionToken>
      <SecretAccessKey>wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY</SecretAccessKey>
      <Expiration>2026-11-22T03:00:00Z</Expiration>
      <AccessKeyId>ASIAEXAMPLE</AccessKeyId>
    </Credentials>
    <Audience>sts.amazonaws.com</Audience>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>ad4156e9-bce1-11e2-82e6-6b6efEXAMPLE</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>)";

TEST(CredentialParseTest, StsAssumeRoleWithWebIdentityAnswer) {
  auto c = ParseAssumeRoleWithWebIdentity(kStsAnswer, "STS at x");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->access_key, "ASIAEXAMPLE");
  EXPECT_EQ(c->secret_key, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
  EXPECT_EQ(c->session_token, "FwoGZXIvYXdzEXAMPLETOKEN");
  ASSERT_TRUE(c->expiration.has_value());
  EXPECT_EQ(UnixSeconds(*c->expiration), 1795316400);
}

TEST(CredentialParseTest, BadStsAnswersNameTheRequestNotTheSecrets) {
  std::string no_token(kStsAnswer);
  no_token.replace(no_token.find("<SessionToken>"), 50, "");
  for (const std::string& bad : {std::string("not xml <"), std::string("<Other/>"), no_token}) {
    auto c = ParseAssumeRoleWithWebIdentity(bad, "STS at http://sts");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kDataLoss);
    EXPECT_NE(c.status().message().find("STS at http://sts"), std::string::npos);
    EXPECT_EQ(c.status().message().find("EXAMPLEKEY"), std::string::npos);
  }
  std::string code, message;
  ASSERT_TRUE(ParseStsError(
      "<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code>"
      "<Message>Not authorized to perform sts:AssumeRoleWithWebIdentity</Message></Error>"
      "<RequestId>1</RequestId></ErrorResponse>",
      &code, &message));
  EXPECT_EQ(code, "AccessDenied");
  EXPECT_EQ(message, "Not authorized to perform sts:AssumeRoleWithWebIdentity");
  EXPECT_FALSE(ParseStsError(kStsAnswer, &code, &message));
  EXPECT_FALSE(ParseStsError("", &code, &message));
}

TEST(CredentialSourceTest, WebIdentityEndpointAndSessionName) {
  std::map<std::string, std::string> vars = {{"AWS_WEB_IDENTITY_TOKEN_FILE", "/t"},
                                             {"AWS_ROLE_ARN", "arn:aws:iam::1:role/r"},
                                             {"AWS_ROLE_SESSION_NAME", "job-7"}};
  auto s = WebIdentitySourceFromEnv(FakeEnv(vars), "");
  ASSERT_TRUE(s.ok() && s->has_value());
  const WebIdentitySource& w = **s;
  EXPECT_EQ(w.sts_endpoint, "https://sts.amazonaws.com");
  EXPECT_EQ(w.session_name, "job-7");
  EXPECT_EQ(w.token_file, "/t");
  EXPECT_EQ((*WebIdentitySourceFromEnv(FakeEnv(vars), "cn-north-1"))->sts_endpoint,
            "https://sts.cn-north-1.amazonaws.com.cn");
  vars["AWS_ENDPOINT_URL"] = "http://127.0.0.1:5000/";
  EXPECT_EQ((*WebIdentitySourceFromEnv(FakeEnv(vars), "us-east-1"))->sts_endpoint,
            "http://127.0.0.1:5000");
  vars["AWS_ENDPOINT_URL_STS"] = "https://sts.internal";
  EXPECT_EQ((*WebIdentitySourceFromEnv(FakeEnv(vars), "us-east-1"))->sts_endpoint,
            "https://sts.internal");
  vars["AWS_ENDPOINT_URL_STS"] = "sts.internal";
  auto bad = WebIdentitySourceFromEnv(FakeEnv(vars), "us-east-1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("AWS_ENDPOINT_URL_STS"), std::string::npos);
  vars.erase("AWS_ROLE_ARN");
  auto no_role = WebIdentitySourceFromEnv(FakeEnv(vars), "us-east-1");
  ASSERT_FALSE(no_role.ok());
  EXPECT_NE(no_role.status().message().find("AWS_ROLE_ARN is not"), std::string::npos);
}

TEST(CredentialSourceTest, WebIdentityNeedsItsTokenFileAndSaysWhereItAsks) {
  auto none = WebIdentitySourceFromEnv(FakeEnv({{"AWS_ROLE_ARN", "arn:aws:iam::1:role/r"}}), "us-east-1");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());
  WebIdentitySource w{"/var/run/token", "arn:aws:iam::1:role/r", "", "https://u:hunter2@sts.internal"};
  const std::string d = DescribeSource(w);
  EXPECT_NE(d.find("arn:aws:iam::1:role/r"), std::string::npos) << d;
  EXPECT_NE(d.find("/var/run/token"), std::string::npos) << d;
  EXPECT_NE(d.find("https://sts.internal"), std::string::npos) << d;
  EXPECT_EQ(d.find("hunter2"), std::string::npos) << d;
}

}  // namespace
}  // namespace ddp::store_internal
