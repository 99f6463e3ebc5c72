#include "store/s3/credentials/profile.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "store/s3/credentials/credentials_testutil.h"

namespace ddp::store_internal {
namespace {

using testing::FakeEnv;
using testing::TempFile;

TEST(ProfileTest, TheSharedFilesAreFoundByVariableOrHome) {
  EXPECT_EQ(SharedCredentialsFile(FakeEnv({{"HOME", "/home/u"}})), "/home/u/.aws/credentials");
  EXPECT_EQ(SharedConfigFile(FakeEnv({{"HOME", "/home/u"}})), "/home/u/.aws/config");
  auto env = FakeEnv({{"HOME", "/home/u"}, {"AWS_SHARED_CREDENTIALS_FILE", "/c"}, {"AWS_CONFIG_FILE", "/f"}});
  EXPECT_EQ(SharedCredentialsFile(env), "/c");
  EXPECT_EQ(SharedConfigFile(env), "/f");
  EXPECT_EQ(SharedCredentialsFile(FakeEnv({})), "");
}

TEST(ProfileTest, IniSectionsCommentsAndMissingFiles) {
  std::string path = TempFile(
      "# comment\n; also a comment\n[default]\nkey = value \n\n[ profile work ]\nregion=eu-west-1\n"
      "no equals sign\n[default]\nsecond = 2\n");
  auto def = ReadIniSection(path, "default");
  ASSERT_TRUE(def.ok() && def->has_value()) << def.status().ToString();
  EXPECT_EQ((*def)->at("key"), "value");
  EXPECT_EQ((*def)->at("second"), "2");  // a section given twice is merged
  auto work = ReadIniSection(path, "profile work");
  ASSERT_TRUE(work.ok() && work->has_value());
  EXPECT_EQ((*work)->size(), 1u);
  EXPECT_EQ((*work)->at("region"), "eu-west-1");
  auto absent = ReadIniSection(path, "other");
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->has_value());
  std::filesystem::remove(path);
  auto missing = ReadIniSection(path, "default");
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  EXPECT_FALSE(missing->has_value());
}

TEST(ProfileTest, KeysFromTheCredentialsFileRegionFromTheConfigFile) {
  std::string creds = TempFile("[work]\naws_access_key_id = WK\naws_secret_access_key = WS\n");
  std::string config = TempFile(
      "[default]\naws_access_key_id = DK\naws_secret_access_key = DS\nregion = us-west-1\n"
      "[profile work]\naws_access_key_id = CK\naws_secret_access_key = CS\nregion = eu-central-1\n");
  auto env = FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", creds}, {"AWS_CONFIG_FILE", config}});
  std::string region;
  bool found = false;
  auto work = ProfileCredentials(env, "work", &region, &found);
  ASSERT_TRUE(work.ok() && work->has_value()) << work.status().ToString();
  EXPECT_TRUE(found);
  EXPECT_EQ((*work)->access_key, "WK");  // the credentials file wins over the config file
  EXPECT_EQ((*work)->source, "profile 'work' in " + creds);
  EXPECT_EQ(region, "eu-central-1");
  region.clear();
  auto def = ProfileCredentials(env, "default", &region, &found);  // "[default]", not "[profile default]"
  ASSERT_TRUE(def.ok() && def->has_value());
  EXPECT_EQ((*def)->access_key, "DK");
  EXPECT_EQ((*def)->source, "profile 'default' in " + config);
  EXPECT_EQ(region, "us-west-1");
  region = "ap-south-1";  // a region set before is kept
  ASSERT_TRUE(ProfileCredentials(env, "work", &region, &found).ok());
  EXPECT_EQ(region, "ap-south-1");
  auto nope = ProfileCredentials(env, "nope", &region, &found);
  ASSERT_TRUE(nope.ok());
  EXPECT_FALSE(nope->has_value());
  EXPECT_FALSE(found);
  std::filesystem::remove(creds);
  std::filesystem::remove(config);
}

TEST(ProfileTest, ANamedProfileMustHaveKeys) {
  std::string config = TempFile("[profile regional]\nregion = eu-north-1\n");
  auto env = FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials"}, {"AWS_CONFIG_FILE", config}});
  std::string region;
  auto keyless = NamedProfileCredentials(env, "regional", "s3://b/p", &region);
  ASSERT_FALSE(keyless.ok());
  EXPECT_EQ(keyless.status().code(), Code::kUnauthenticated);
  EXPECT_EQ(keyless.status().message(),
            "AWS_PROFILE='regional' has no aws_access_key_id/aws_secret_access_key (looked in "
            "/nonexistent/credentials and " + config + ") for s3://b/p");
  EXPECT_EQ(region, "eu-north-1");
  auto absent = NamedProfileCredentials(env, "absent", "s3://b", &region);
  ASSERT_FALSE(absent.ok());
  EXPECT_NE(absent.status().message().find("'absent' is not in the shared credentials or config file"),
            std::string::npos)
      << absent.status().ToString();
  std::filesystem::remove(config);
}

}  // namespace
}  // namespace ddp::store_internal
