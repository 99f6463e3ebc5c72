// ResolveS3Config: the bucket, prefix, region, endpoint and credentials of an s3:// URL
// from StoreOptions and the AWS conventions, without a server.
#include "store/s3/s3_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "store/s3/credentials/credentials_testutil.h"

namespace ddp {
namespace {

using store_internal::ResolveS3Config;
using store_internal::testing::FakeEnv;
using store_internal::testing::TempFile;

TEST(S3ConfigTest, EnvironmentCredentialsRegionAndEndpoint) {
  auto c = ResolveS3Config("s3://my-bucket/some/prefix/", {},
                           FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"},
                                    {"AWS_SECRET_ACCESS_KEY", "SK"},
                                    {"AWS_SESSION_TOKEN", "TOK"},
                                    {"AWS_DEFAULT_REGION", "eu-west-3"},
                                    {"AWS_ENDPOINT_URL", "http://127.0.0.1:9000/"}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->bucket, "my-bucket");
  EXPECT_EQ(c->prefix, "some/prefix");
  EXPECT_EQ(c->region, "eu-west-3");
  ASSERT_TRUE(c->credentials.has_value());
  EXPECT_EQ(c->credentials->access_key, "AK");
  EXPECT_EQ(c->credentials->session_token, "TOK");
  EXPECT_EQ(c->BucketUrl(), "http://127.0.0.1:9000/my-bucket");
}

TEST(S3ConfigTest, ServiceSpecificEndpointAndOptionsWin) {
  StoreOptions o;
  o.region = "ap-south-1";
  auto env = FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"},
                      {"AWS_REGION", "us-west-2"}, {"AWS_ENDPOINT_URL", "http://general:1"},
                      {"AWS_ENDPOINT_URL_S3", "http://s3only:2"}});
  auto c = ResolveS3Config("s3://b", o, env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->region, "ap-south-1");
  EXPECT_EQ(c->BucketUrl(), "http://s3only:2/b");
  o.endpoint_url = "https://explicit:3";
  EXPECT_EQ(ResolveS3Config("s3://b", o, env)->BucketUrl(), "https://explicit:3/b");
}

TEST(S3ConfigTest, CredentialsInUrlsNeverReachMessages) {
  auto env = FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"},
                      {"AWS_ENDPOINT_URL_S3", "ftp://user:hunter2@host:9"}});
  Status bad_env = ResolveS3Config("s3://b", {}, env).status();
  EXPECT_EQ(bad_env.code(), Code::kInvalidArgument) << bad_env.ToString();
  EXPECT_NE(bad_env.message().find("ftp://host:9"), std::string::npos) << bad_env.ToString();
  StoreOptions o;
  o.endpoint_url = "gopher://u:hunter2@h";
  Status bad_opt = ResolveS3Config("s3://b", o, env).status();
  Status bad_bucket = ResolveS3Config("s3://AKIA:hunter2@b/p", {}, env).status();
  EXPECT_EQ(bad_bucket.code(), Code::kInvalidArgument) << bad_bucket.ToString();
  for (const Status& s : {bad_env, bad_opt, bad_bucket}) {
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message().find("hunter2"), std::string::npos) << s.ToString();
  }
}

TEST(S3ConfigTest, AwsDefaultsToVirtualHostedStyle) {
  auto env = FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"}});
  auto c = ResolveS3Config("s3://bucket", {}, env);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->region, "us-east-1");
  EXPECT_EQ(c->BucketUrl(), "https://bucket.s3.us-east-1.amazonaws.com");
  auto dotted = ResolveS3Config("s3://my.bucket", {}, env);
  ASSERT_TRUE(dotted.ok());
  EXPECT_EQ(dotted->BucketUrl(), "https://s3.us-east-1.amazonaws.com/my.bucket");
}

TEST(S3ConfigTest, ProfilesFromTheSharedFiles) {
  std::string creds = TempFile(
      "[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = DEFSECRET\n\n"
      "# comment\n[work]\naws_access_key_id=WORKKEY\naws_secret_access_key=WORKSECRET\n"
      "aws_session_token = WORKTOKEN\n");
  std::string config = TempFile("[profile work]\nregion = eu-central-1\n");
  auto c = ResolveS3Config("s3://b", {},
                           FakeEnv({{"AWS_PROFILE", "work"},
                                    {"AWS_SHARED_CREDENTIALS_FILE", creds},
                                    {"AWS_CONFIG_FILE", config},
                                    {"AWS_ACCESS_KEY_ID", "ENVKEY"},
                                    {"AWS_SECRET_ACCESS_KEY", "ENVSECRET"}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->credentials->access_key, "WORKKEY");
  EXPECT_EQ(c->credentials->session_token, "WORKTOKEN");
  EXPECT_EQ(c->region, "eu-central-1");

  auto d = ResolveS3Config("s3://b", {}, FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", creds}}));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->credentials->access_key, "DEFKEY");

  auto missing = ResolveS3Config("s3://b", {},
                                 FakeEnv({{"AWS_PROFILE", "nope"},
                                          {"AWS_SHARED_CREDENTIALS_FILE", creds},
                                          {"AWS_CONFIG_FILE", config}}));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kUnauthenticated);
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);
  EXPECT_EQ(missing.status().message().find("SECRET"), std::string::npos);
  std::filesystem::remove(creds);
  std::filesystem::remove(config);
}

TEST(S3ConfigTest, MissingCredentialsIsAClearErrorUnlessAnonymous) {
  // Instance metadata is the last resort unless disabled: then nothing is left.
  auto env = FakeEnv({{"HOME", "/nonexistent-home"}, {"AWS_EC2_METADATA_DISABLED", "true"}});
  auto c = ResolveS3Config("s3://b/p", {}, env);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kUnauthenticated);
  EXPECT_NE(c.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
  EXPECT_NE(c.status().message().find("AWS_WEB_IDENTITY_TOKEN_FILE"), std::string::npos);
  EXPECT_NE(c.status().message().find("s3://b/p"), std::string::npos);
  EXPECT_NE(c.status().message().find("anon"), std::string::npos);

  StoreOptions anon;
  anon.anonymous = true;
  auto a = ResolveS3Config("s3://b/p", anon, env);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->credentials.has_value());

  EXPECT_FALSE(a->credential_source.has_value());

  auto half = ResolveS3Config("s3://b", {}, FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}}));
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("AWS_SECRET_ACCESS_KEY is not set"), std::string::npos);
}

TEST(S3ConfigTest, TheChainGoesOnToTemporaryCredentialsInAwsOrder) {
  std::string creds = TempFile("[default]\naws_access_key_id = DEF\naws_secret_access_key = S\n");
  std::map<std::string, std::string> vars = {
      {"HOME", "/nonexistent-home"},
      {"AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/token"},
      {"AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/trainer"},
      {"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/abc"},
      {"AWS_REGION", "eu-west-1"}};
  auto source_of = [](const std::map<std::string, std::string>& v) {
    auto c = ResolveS3Config("s3://b", {}, FakeEnv(v));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_FALSE(c->credentials.has_value());
    return c.ok() ? c->credential_source : std::nullopt;
  };
  // Fixed keys come first: the environment, then the default profile.
  auto with_keys = vars;
  with_keys["AWS_ACCESS_KEY_ID"] = "AK";
  with_keys["AWS_SECRET_ACCESS_KEY"] = "SK";
  EXPECT_EQ(ResolveS3Config("s3://b", {}, FakeEnv(with_keys))->credentials->access_key, "AK");
  auto with_file = vars;
  with_file["AWS_SHARED_CREDENTIALS_FILE"] = creds;
  EXPECT_EQ(ResolveS3Config("s3://b", {}, FakeEnv(with_file))->credentials->access_key, "DEF");
  std::filesystem::remove(creds);

  auto web = source_of(vars);
  ASSERT_TRUE(web && std::holds_alternative<store_internal::WebIdentitySource>(*web));
  EXPECT_EQ(std::get<store_internal::WebIdentitySource>(*web).sts_endpoint,
            "https://sts.eu-west-1.amazonaws.com");
  vars.erase("AWS_WEB_IDENTITY_TOKEN_FILE");
  auto container = source_of(vars);
  ASSERT_TRUE(container && std::holds_alternative<store_internal::ContainerSource>(*container));
  EXPECT_EQ(std::get<store_internal::ContainerSource>(*container).url,
            "http://169.254.170.2/v2/credentials/abc");
  vars.erase("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  auto imds = source_of(vars);
  ASSERT_TRUE(imds && std::holds_alternative<store_internal::ImdsSource>(*imds));
  EXPECT_EQ(std::get<store_internal::ImdsSource>(*imds).endpoint, "http://169.254.169.254");

  StoreOptions anon;
  anon.anonymous = true;
  auto a = ResolveS3Config("s3://b", anon, FakeEnv(vars));
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->credentials || a->credential_source);
}

TEST(S3ConfigTest, RejectsBadUrls) {
  auto env = FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"}});
  for (std::string bad : {"s3://", "s3:///key", "s3://bad bucket/x", "s3://b/p\\0"}) {
    if (bad.ends_with("\\0")) bad = std::string("s3://b/p\0x", 10);
    auto c = ResolveS3Config(bad, {}, env);
    EXPECT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << c.status().ToString();
  }
  StoreOptions o;
  o.endpoint_url = "ftp://x";
  EXPECT_EQ(ResolveS3Config("s3://b", o, env).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ddp
