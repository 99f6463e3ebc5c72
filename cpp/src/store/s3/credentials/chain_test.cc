#include "store/s3/credentials/chain.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "store/s3/credentials/credentials_testutil.h"

namespace ddp::store_internal {
namespace {

using testing::FakeEnv;
using testing::TempFile;

TEST(CredentialChainTest, FixedKeysInAwsOrder) {
  std::string creds = TempFile(
      "[default]\naws_access_key_id = DEF\naws_secret_access_key = S\n"
      "[work]\naws_access_key_id = WORK\naws_secret_access_key = S\nregion = eu-west-2\n");
  std::map<std::string, std::string> vars = {{"HOME", "/nonexistent-home"},
                                             {"AWS_SHARED_CREDENTIALS_FILE", creds},
                                             {"AWS_PROFILE", "work"},
                                             {"AWS_ACCESS_KEY_ID", "ENV"},
                                             {"AWS_SECRET_ACCESS_KEY", "S"}};
  auto key_of = [](const std::map<std::string, std::string>& v, std::string* region) {
    auto c = FixedCredentials(FakeEnv(v), "s3://b", region);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() && c->has_value() ? (*c)->access_key : std::string("<none>");
  };
  std::string region;
  EXPECT_EQ(key_of(vars, &region), "WORK");  // 1. AWS_PROFILE, over the environment's keys
  EXPECT_EQ(region, "eu-west-2");
  vars.erase("AWS_PROFILE");
  EXPECT_EQ(key_of(vars, &region), "ENV");  // 2. the environment, over the default profile
  vars.erase("AWS_ACCESS_KEY_ID");
  vars.erase("AWS_SECRET_ACCESS_KEY");
  EXPECT_EQ(key_of(vars, &region), "DEF");  // 3. the default profile
  vars.erase("AWS_SHARED_CREDENTIALS_FILE");
  EXPECT_EQ(key_of(vars, &region), "<none>");
  std::filesystem::remove(creds);

  auto half = FixedCredentials(FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}}), "s3://b", &region);
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("AWS_SECRET_ACCESS_KEY is not set"), std::string::npos);
  auto no_profile = FixedCredentials(FakeEnv({{"HOME", "/nonexistent-home"}, {"AWS_PROFILE", "nope"}}), "s3://b/p",
                                     &region);
  ASSERT_FALSE(no_profile.ok());
  EXPECT_NE(no_profile.status().message().find("AWS_PROFILE='nope'"), std::string::npos);
  EXPECT_NE(no_profile.status().message().find("s3://b/p"), std::string::npos);
}

TEST(CredentialChainTest, TemporarySourcesInAwsOrder) {
  std::map<std::string, std::string> vars = {{"AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/token"},
                                             {"AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/trainer"},
                                             {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/abc"}};
  auto source_of = [](const std::map<std::string, std::string>& v) {
    auto s = TemporaryCredentialSource(FakeEnv(v), "eu-west-1");
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : std::nullopt;
  };
  auto web = source_of(vars);
  ASSERT_TRUE(web && std::holds_alternative<WebIdentitySource>(*web));
  EXPECT_EQ(std::get<WebIdentitySource>(*web).sts_endpoint, "https://sts.eu-west-1.amazonaws.com");
  vars.erase("AWS_WEB_IDENTITY_TOKEN_FILE");
  auto container = source_of(vars);
  ASSERT_TRUE(container && std::holds_alternative<ContainerSource>(*container));
  EXPECT_EQ(DescribeSource(*container), "container credentials at http://169.254.170.2/v2/credentials/abc");
  vars.erase("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  auto imds = source_of(vars);
  ASSERT_TRUE(imds && std::holds_alternative<ImdsSource>(*imds));
  EXPECT_EQ(DescribeSource(*imds), "EC2 instance metadata at http://169.254.169.254");
  vars["AWS_EC2_METADATA_DISABLED"] = "true";
  EXPECT_FALSE(source_of(vars).has_value());
}

TEST(CredentialChainTest, AnErrorInASourceStopsTheChain) {
  // A web identity without its role is a mistake to report, not a reason to go on to the
  // container agent.
  auto s = TemporaryCredentialSource(FakeEnv({{"AWS_WEB_IDENTITY_TOKEN_FILE", "/t"},
                                              {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/x"}}),
                                     "us-east-1");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("AWS_ROLE_ARN"), std::string::npos) << s.status().ToString();
  auto bad_imds = TemporaryCredentialSource(FakeEnv({{"AWS_METADATA_SERVICE_NUM_ATTEMPTS", "many"}}), "us-east-1");
  ASSERT_FALSE(bad_imds.ok());
  EXPECT_NE(bad_imds.status().message().find("AWS_METADATA_SERVICE_NUM_ATTEMPTS"), std::string::npos);
}

TEST(CredentialChainTest, EachSourceGetsItsFetch) {
  const CredentialSource sources[] = {
      WebIdentitySource{"/t", "arn:aws:iam::1:role/r", "", "https://sts.amazonaws.com"},
      ContainerSource{"http://127.0.0.1:1/c", "", ""}, ImdsSource{}};
  for (const CredentialSource& s : sources) {
    auto fetch = MakeCredentialFetch(s, "");
    ASSERT_TRUE(fetch.ok()) << DescribeSource(s) << ": " << fetch.status().ToString();
    EXPECT_TRUE(static_cast<bool>(*fetch)) << DescribeSource(s);
  }
  // The web identity fetch reads its token file first: a missing one fails before any
  // request, naming the file.
  auto web = MakeCredentialFetch(sources[0], "");
  ASSERT_TRUE(web.ok());
  Result<AwsCredentials> r = (*web)();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnauthenticated);
  EXPECT_NE(r.status().message().find("web identity token file /t"), std::string::npos) << r.status().ToString();
}

TEST(CredentialChainTest, NoCredentialsSaysWhatToSet) {
  Status s = NoCredentialsError("s3://u:hunter2@b/p", FakeEnv({{"HOME", "/home/u"}}), "connection refused");
  EXPECT_EQ(s.code(), Code::kUnauthenticated);
  for (const char* says : {"no AWS credentials for s3://b/p", "AWS_ACCESS_KEY_ID", "/home/u/.aws/credentials",
                           "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "anon=True",
                           "(connection refused)"}) {
    EXPECT_NE(s.message().find(says), std::string::npos) << says << " in " << s.ToString();
  }
  EXPECT_EQ(s.message().find("hunter2"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace ddp::store_internal
