// EC2 instance metadata (IMDSv2: a session token first, then the role's keys), for the
// temporary keys of the instance profile. The chain's last resort.
#pragma once

#include <optional>
#include <string>

#include "ddp/status.h"
#include "store/s3/credentials/environment.h"
#include "store/s3/credentials/http_fetch.h"

namespace ddp::store_internal {

struct ImdsSource {
  std::string endpoint = "http://169.254.169.254";  // no trailing '/'
  double timeout_s = 1.0;                           // connect timeout: off EC2 nothing answers
  int attempts = 1;
};

// The source with the environment's settings (AWS_EC2_METADATA_SERVICE_ENDPOINT(_MODE),
// AWS_METADATA_SERVICE_TIMEOUT, AWS_METADATA_SERVICE_NUM_ATTEMPTS); nullopt when
// AWS_EC2_METADATA_DISABLED=true. Errors name the variable that is set wrong.
Result<std::optional<ImdsSource>> ImdsSourceFromEnv(const EnvLookup& env);

// "EC2 instance metadata at http://169.254.169.254".
std::string DescribeSource(const ImdsSource& source);

// Asks the instance metadata service once per call (token, role name, keys); never
// through a proxy. `ca_bundle` as in ClientConfig.
Result<CredentialFetch> MakeImdsFetch(const ImdsSource& source, const std::string& ca_bundle);

}  // namespace ddp::store_internal
