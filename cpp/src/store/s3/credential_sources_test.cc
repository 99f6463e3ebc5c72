#include "store/s3/credential_sources.h"

#include <gtest/gtest.h>

#include <map>

namespace ddp::store_internal {
namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

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

int64_t Epoch(WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

TEST(CredentialParseTest, StsAssumeRoleWithWebIdentityAnswer) {
  auto c = ParseAssumeRoleWithWebIdentity(kStsAnswer, "STS at x");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->access_key, "ASIAEXAMPLE");
  EXPECT_EQ(c->secret_key, "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
  EXPECT_EQ(c->session_token, "FwoGZXIvYXdzEXAMPLETOKEN");
  ASSERT_TRUE(c->expiration.has_value());
  EXPECT_EQ(Epoch(*c->expiration), 1795316400);
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

TEST(CredentialParseTest, ContainerAndInstanceMetadataJson) {
  // ECS / EKS Pod Identity shape.
  auto c = ParseCredentialsJson(R"({"AccessKeyId": "ASIA1", "SecretAccessKey": "S1",
      "Token": "T1", "Expiration": "2026-11-22T03:00:00Z",
      "RoleArn": "arn:aws:iam::123456789012:role/x", "AccountId": "123456789012"})",
                                "container credentials at http://169.254.170.2/v2/x");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->access_key, "ASIA1");
  EXPECT_EQ(c->session_token, "T1");
  EXPECT_EQ(Epoch(*c->expiration), 1795316400);
  // EC2 instance metadata shape.
  auto m = ParseCredentialsJson(R"({
    "Code" : "Success", "LastUpdated" : "2026-11-22T02:00:00Z", "Type" : "AWS-HMAC",
    "AccessKeyId" : "ASIA2", "SecretAccessKey" : "S2", "Token" : "T2",
    "Expiration" : "2026-11-22T08:00:00Z" })",
                                "imds");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->secret_key, "S2");
  EXPECT_EQ(Epoch(*m->expiration), 1795316400 + 5 * 3600);
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

TEST(CredentialSourceTest, WebIdentityEndpointAndSessionName) {
  std::map<std::string, std::string> vars = {{"AWS_WEB_IDENTITY_TOKEN_FILE", "/t"},
                                             {"AWS_ROLE_ARN", "arn:aws:iam::1:role/r"},
                                             {"AWS_ROLE_SESSION_NAME", "job-7"}};
  auto s = TemporaryCredentialSource(FakeEnv(vars), "");
  ASSERT_TRUE(s.ok() && s->has_value());
  auto w = std::get<WebIdentitySource>(**s);
  EXPECT_EQ(w.sts_endpoint, "https://sts.amazonaws.com");
  EXPECT_EQ(w.session_name, "job-7");
  EXPECT_EQ(w.token_file, "/t");
  EXPECT_EQ(std::get<WebIdentitySource>(**TemporaryCredentialSource(FakeEnv(vars), "cn-north-1"))
                .sts_endpoint,
            "https://sts.cn-north-1.amazonaws.com.cn");
  vars["AWS_ENDPOINT_URL"] = "http://127.0.0.1:5000/";
  EXPECT_EQ(std::get<WebIdentitySource>(**TemporaryCredentialSource(FakeEnv(vars), "us-east-1"))
                .sts_endpoint,
            "http://127.0.0.1:5000");
  vars["AWS_ENDPOINT_URL_STS"] = "https://sts.internal";
  EXPECT_EQ(std::get<WebIdentitySource>(**TemporaryCredentialSource(FakeEnv(vars), "us-east-1"))
                .sts_endpoint,
            "https://sts.internal");
  vars["AWS_ENDPOINT_URL_STS"] = "sts.internal";
  auto bad = TemporaryCredentialSource(FakeEnv(vars), "us-east-1");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("AWS_ENDPOINT_URL_STS"), std::string::npos);
  vars.erase("AWS_ROLE_ARN");
  auto no_role = TemporaryCredentialSource(FakeEnv(vars), "us-east-1");
  ASSERT_FALSE(no_role.ok());
  EXPECT_NE(no_role.status().message().find("AWS_ROLE_ARN is not"), std::string::npos);
}

TEST(CredentialSourceTest, ContainerUrisAndTheirChecks) {
  auto source = [](std::map<std::string, std::string> vars) {
    return TemporaryCredentialSource(FakeEnv(std::move(vars)), "us-east-1");
  };
  auto rel = source({{"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/id"},
                     {"AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:1/x"}});
  EXPECT_EQ(std::get<ContainerSource>(**rel).url, "http://169.254.170.2/v2/credentials/id");
  auto full = source({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://169.254.170.23/v1/credentials"},
                      {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "tok"},
                      {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "/var/run/token"}});
  ASSERT_TRUE(full.ok());
  const auto& c = std::get<ContainerSource>(**full);
  EXPECT_EQ(c.url, "http://169.254.170.23/v1/credentials");
  EXPECT_EQ(c.auth_token, "tok");
  EXPECT_EQ(c.auth_token_file, "/var/run/token");
  for (const char* ok : {"http://localhost:8080/c", "http://127.0.0.2/c", "http://[::1]:9/c",
                         "http://[fd00:ec2::23]/v1/credentials", "https://creds.example.com/c"}) {
    EXPECT_TRUE(source({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", ok}}).ok()) << ok;
  }
  for (const char* bad : {"http://creds.example.com/c", "http://127.0.0.1.evil.com/c",
                          "http://user@10.0.0.1/c", "ftp://127.0.0.1/c"}) {
    auto r = source({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", bad}});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find("AWS_CONTAINER_CREDENTIALS_FULL_URI"),
              std::string::npos);
  }
}

TEST(CredentialSourceTest, InstanceMetadataSettings) {
  auto source = [](std::map<std::string, std::string> vars) {
    return TemporaryCredentialSource(FakeEnv(std::move(vars)), "us-east-1");
  };
  auto d = source({});
  const auto& def = std::get<ImdsSource>(**d);
  EXPECT_EQ(def.endpoint, "http://169.254.169.254");
  EXPECT_EQ(def.timeout_s, 1.0);
  EXPECT_EQ(def.attempts, 1);
  auto custom = source({{"AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9/"},
                        {"AWS_METADATA_SERVICE_TIMEOUT", "2.5"},
                        {"AWS_METADATA_SERVICE_NUM_ATTEMPTS", "3"}});
  const auto& m = std::get<ImdsSource>(**custom);
  EXPECT_EQ(m.endpoint, "http://127.0.0.1:9");
  EXPECT_EQ(m.timeout_s, 2.5);
  EXPECT_EQ(m.attempts, 3);
  EXPECT_EQ(std::get<ImdsSource>(**source({{"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv6"}}))
                .endpoint,
            "http://[fd00:ec2::254]");
  for (const char* off : {"true", "TRUE", " true\n"}) {
    auto none = source({{"AWS_EC2_METADATA_DISABLED", off}});
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->has_value()) << off;
  }
  EXPECT_TRUE(source({{"AWS_EC2_METADATA_DISABLED", "false"}})->has_value());
  EXPECT_FALSE(source({{"AWS_METADATA_SERVICE_TIMEOUT", "soon"}}).ok());
  EXPECT_FALSE(source({{"AWS_METADATA_SERVICE_NUM_ATTEMPTS", "0"}}).ok());
}

}  // namespace
}  // namespace ddp::store_internal
