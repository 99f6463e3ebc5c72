// Container credentials (ECS, Fargate, EKS Pod Identity): the agent at
// AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (on 169.254.170.2) or _FULL_URI, with
// AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE) as the Authorization header, for temporary keys.
#pragma once

#include <optional>
#include <string>

#include "ddp/status.h"
#include "store/s3/credentials/environment.h"
#include "store/s3/credentials/http_fetch.h"

namespace ddp::store_internal {

struct ContainerSource {
  std::string url;
  std::string auth_token;       // never in messages
  std::string auth_token_file;  // read at every fetch (rotated); wins over auth_token
};

// The source the two URI variables select (the relative one when both are set); nullopt
// when neither is. A full URI must be https, or http to a loopback address or the ECS /
// EKS agents; errors name the variable.
Result<std::optional<ContainerSource>> ContainerSourceFromEnv(const EnvLookup& env);

// "container credentials at http://169.254.170.2/..." (the URL redacted).
std::string DescribeSource(const ContainerSource& source);

// Asks the agent once per call, reading the token file each time. `ca_bundle` as in
// ClientConfig.
Result<CredentialFetch> MakeContainerFetch(const ContainerSource& source, const std::string& ca_bundle);

}  // namespace ddp::store_internal
