#include "store/s3/credentials/container.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "store/s3/credentials/credentials_testutil.h"

namespace ddp::store_internal {
namespace {

using testing::FakeEnv;

TEST(CredentialSourceTest, ContainerUrisAndTheirChecks) {
  auto source = [](std::map<std::string, std::string> vars) {
    return ContainerSourceFromEnv(FakeEnv(std::move(vars)));
  };
  auto rel = source({{"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/id"},
                     {"AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://127.0.0.1:1/x"}});
  EXPECT_EQ((*rel)->url, "http://169.254.170.2/v2/credentials/id");
  auto full = source({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", "http://169.254.170.23/v1/credentials"},
                      {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "tok"},
                      {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "/var/run/token"}});
  ASSERT_TRUE(full.ok());
  const ContainerSource& c = **full;
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

TEST(CredentialSourceTest, ContainerNeedsAUriAndNeverShowsItsPassword) {
  auto none = ContainerSourceFromEnv(FakeEnv({{"AWS_CONTAINER_AUTHORIZATION_TOKEN", "tok"}}));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());
  auto with_user = ContainerSourceFromEnv(
      FakeEnv({{"AWS_CONTAINER_CREDENTIALS_FULL_URI", "https://user:hunter2@creds.example.com/c"},
               {"AWS_CONTAINER_AUTHORIZATION_TOKEN", "TOPSECRET"}}));
  ASSERT_TRUE(with_user.ok() && with_user->has_value()) << with_user.status().ToString();
  const std::string d = DescribeSource(**with_user);
  EXPECT_NE(d.find("creds.example.com/c"), std::string::npos) << d;
  EXPECT_EQ(d.find("hunter2"), std::string::npos) << d;
  EXPECT_EQ(d.find("TOPSECRET"), std::string::npos) << d;
}

TEST(CredentialSourceTest, AFailedContainerFetchNamesTheAgent) {
  // Port 1 on loopback: nothing listens, the connection is refused at once.
  ContainerSource src{"http://127.0.0.1:1/v2/credentials", "TOPSECRET", ""};
  auto fetch = MakeContainerFetch(src, "");
  ASSERT_TRUE(fetch.ok()) << fetch.status().ToString();
  Result<AwsCredentials> r = (*fetch)();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("container credentials at http://127.0.0.1:1/v2/credentials"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(r.status().message().find("TOPSECRET"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace ddp::store_internal
