// Temporary AWS credentials from where workloads run, without an AWS SDK:
//  - web identity (EKS IRSA, any OIDC): STS AssumeRoleWithWebIdentity with the token
//    file Kubernetes mounts and rotates (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN);
//  - container credentials (ECS, Fargate, EKS Pod Identity): the agent at
//    AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (on 169.254.170.2) or _FULL_URI, with
//    AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE) as the Authorization header;
//  - EC2 instance metadata (IMDSv2: a session token first, then the role's keys).
// The requests go through CurlClient (libcurl); the answers are parsed here, and their
// text never reaches an error message, since it carries secrets.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "store/s3/aws_credentials.h"

namespace ddp::store_internal {

// Reads an environment variable; tests inject their own.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// The variable's value, or "" when it is not set.
std::string EnvOrEmpty(const EnvLookup& env, const char* name);

struct WebIdentitySource {
  std::string token_file;
  std::string role_arn;
  std::string session_name;  // empty: "dask-ddp-<unix time in ms>" per request
  std::string sts_endpoint;  // scheme://host[:port], no trailing '/'
};

struct ContainerSource {
  std::string url;
  std::string auth_token;       // never in messages
  std::string auth_token_file;  // read at every fetch (rotated); wins over auth_token
};

struct ImdsSource {
  std::string endpoint = "http://169.254.169.254";  // no trailing '/'
  double timeout_s = 1.0;   // connect timeout: off EC2 nothing answers
  int attempts = 1;
};

using CredentialSource = std::variant<WebIdentitySource, ContainerSource, ImdsSource>;

// One line for messages: "web identity (role arn:..., STS at https://...)".
std::string DescribeSource(const CredentialSource& source);

// The source of temporary credentials the environment selects, in the AWS order: web
// identity, container, EC2 instance metadata (unless AWS_EC2_METADATA_DISABLED=true);
// nullopt when none applies. `region` picks the regional STS endpoint. Errors name
// the variable that is set wrong.
Result<std::optional<CredentialSource>> TemporaryCredentialSource(const EnvLookup& env,
                                                                  const std::string& region);

// The credentials in an AssumeRoleWithWebIdentity answer; `what` names the request.
Result<AwsCredentials> ParseAssumeRoleWithWebIdentity(std::string_view xml,
                                                      std::string_view what);
// <ErrorResponse><Error><Code>..</Code><Message>..</Message></Error>; false if not one.
bool ParseStsError(std::string_view xml, std::string* code, std::string* message);
// The container / instance metadata JSON: AccessKeyId, SecretAccessKey, Token,
// Expiration (and Code, which must be "Success" when present).
Result<AwsCredentials> ParseCredentialsJson(std::string_view json, std::string_view what);

// Fetches credentials from `source` once (no caching). `ca_bundle` as in ClientConfig.
using CredentialFetch = std::function<Result<AwsCredentials>()>;
Result<CredentialFetch> MakeCredentialFetch(const CredentialSource& source,
                                            const std::string& ca_bundle);

}  // namespace ddp::store_internal
