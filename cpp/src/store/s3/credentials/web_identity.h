// Web identity (EKS IRSA, any OIDC): STS AssumeRoleWithWebIdentity with the token file
// Kubernetes mounts and rotates (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN), for
// temporary keys.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ddp/status.h"
#include "store/s3/credentials/aws_credentials.h"
#include "store/s3/credentials/environment.h"
#include "store/s3/credentials/http_fetch.h"

namespace ddp::store_internal {

struct WebIdentitySource {
  std::string token_file;
  std::string role_arn;
  std::string session_name;  // empty: "dask-ddp-<unix time in ms>" per request
  std::string sts_endpoint;  // scheme://host[:port], no trailing '/'
};

// The source AWS_WEB_IDENTITY_TOKEN_FILE selects; nullopt when it is not set. The STS
// endpoint: AWS_ENDPOINT_URL_STS, AWS_ENDPOINT_URL, else the regional one of `region`
// (the global one when empty). Errors name the variable that is set wrong.
Result<std::optional<WebIdentitySource>> WebIdentitySourceFromEnv(const EnvLookup& env, const std::string& region);

// "web identity (role arn:..., token file ..., STS at https://...)".
std::string DescribeSource(const WebIdentitySource& source);

// The credentials in an AssumeRoleWithWebIdentity answer; `what` names the request.
Result<AwsCredentials> ParseAssumeRoleWithWebIdentity(std::string_view xml, std::string_view what);

// <ErrorResponse><Error><Code>..</Code><Message>..</Message></Error>; false if not one.
bool ParseStsError(std::string_view xml, std::string* code, std::string* message);

// Asks STS once per call, reading the token file each time (it rotates). `ca_bundle` as
// in ClientConfig.
Result<CredentialFetch> MakeWebIdentityFetch(const WebIdentitySource& source, const std::string& ca_bundle);

}  // namespace ddp::store_internal
