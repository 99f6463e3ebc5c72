#include "store/s3/credentials/environment.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "store/s3/credentials/credentials_testutil.h"

namespace ddp::store_internal {
namespace {

using testing::FakeEnv;

TEST(EnvironmentCredentialsTest, KeysWithOrWithoutASessionToken) {
  auto fixed = EnvironmentCredentials(FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"}}), "s3://b");
  ASSERT_TRUE(fixed.ok() && fixed->has_value()) << fixed.status().ToString();
  EXPECT_EQ((*fixed)->access_key, "AK");
  EXPECT_EQ((*fixed)->secret_key, "SK");
  EXPECT_EQ((*fixed)->session_token, "");
  EXPECT_EQ((*fixed)->source, "environment");
  EXPECT_FALSE((*fixed)->expiration.has_value());
  auto temporary = EnvironmentCredentials(
      FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}, {"AWS_SECRET_ACCESS_KEY", "SK"}, {"AWS_SESSION_TOKEN", "TOK"}}), "s3://b");
  ASSERT_TRUE(temporary.ok() && temporary->has_value());
  EXPECT_EQ((*temporary)->session_token, "TOK");
}

TEST(EnvironmentCredentialsTest, NoneOrHalfAKeyPair) {
  auto none = EnvironmentCredentials(FakeEnv({{"AWS_SESSION_TOKEN", "TOK"}}), "s3://b");
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());
  auto no_secret = EnvironmentCredentials(FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}}), "s3://u:hunter2@b/p");
  ASSERT_FALSE(no_secret.ok());
  EXPECT_EQ(no_secret.status().code(), Code::kUnauthenticated);
  EXPECT_EQ(no_secret.status().message(), "AWS_SECRET_ACCESS_KEY is not set but AWS_ACCESS_KEY_ID is, for s3://b/p");
  auto no_key = EnvironmentCredentials(FakeEnv({{"AWS_SECRET_ACCESS_KEY", "SK"}}), "s3://b");
  ASSERT_FALSE(no_key.ok());
  EXPECT_NE(no_key.status().message().find("AWS_ACCESS_KEY_ID is not set but AWS_SECRET_ACCESS_KEY is"),
            std::string::npos)
      << no_key.status().ToString();
  EXPECT_EQ(no_key.status().message().find("SK"), std::string::npos) << no_key.status().ToString();
}

TEST(EnvironmentTest, ProcessEnvReadsThisProcesssVariables) {
  ASSERT_EQ(::setenv("DDP_ENVIRONMENT_TEST_VARIABLE", "value", 1), 0);
  const EnvLookup env = ProcessEnv();
  EXPECT_EQ(env("DDP_ENVIRONMENT_TEST_VARIABLE"), std::optional<std::string>("value"));
  EXPECT_EQ(EnvOrEmpty(env, "DDP_ENVIRONMENT_TEST_VARIABLE"), "value");
  ASSERT_EQ(::unsetenv("DDP_ENVIRONMENT_TEST_VARIABLE"), 0);
  EXPECT_EQ(env("DDP_ENVIRONMENT_TEST_VARIABLE"), std::nullopt);
  EXPECT_EQ(EnvOrEmpty(env, "DDP_ENVIRONMENT_TEST_VARIABLE"), "");
}

}  // namespace
}  // namespace ddp::store_internal
