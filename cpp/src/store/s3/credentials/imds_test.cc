#include "store/s3/credentials/imds.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "store/s3/credentials/credentials_testutil.h"

namespace ddp::store_internal {
namespace {

using testing::FakeEnv;

TEST(CredentialSourceTest, InstanceMetadataSettings) {
  auto source = [](std::map<std::string, std::string> vars) {
    return ImdsSourceFromEnv(FakeEnv(std::move(vars)));
  };
  auto d = source({});
  const ImdsSource& def = **d;
  EXPECT_EQ(def.endpoint, "http://169.254.169.254");
  EXPECT_EQ(def.timeout_s, 1.0);
  EXPECT_EQ(def.attempts, 1);
  auto custom = source({{"AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9/"},
                        {"AWS_METADATA_SERVICE_TIMEOUT", "2.5"},
                        {"AWS_METADATA_SERVICE_NUM_ATTEMPTS", "3"}});
  const ImdsSource& m = **custom;
  EXPECT_EQ(m.endpoint, "http://127.0.0.1:9");
  EXPECT_EQ(m.timeout_s, 2.5);
  EXPECT_EQ(m.attempts, 3);
  EXPECT_EQ((*source({{"AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv6"}}))->endpoint,
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

TEST(CredentialSourceTest, InstanceMetadataSettingErrorsNameTheVariable) {
  for (const char* var : {"AWS_METADATA_SERVICE_TIMEOUT", "AWS_METADATA_SERVICE_NUM_ATTEMPTS",
                          "AWS_EC2_METADATA_SERVICE_ENDPOINT"}) {
    auto r = ImdsSourceFromEnv(FakeEnv({{var, "nonsense"}}));
    ASSERT_FALSE(r.ok()) << var;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(var), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(DescribeSource(ImdsSource{}), "EC2 instance metadata at http://169.254.169.254");
}

}  // namespace
}  // namespace ddp::store_internal
