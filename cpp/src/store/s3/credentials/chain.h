// The order in which the s3:// back-end looks for credentials, as the AWS SDKs do:
//  fixed keys, the first of
//   1. the profile named by AWS_PROFILE, if set (profile.h);
//   2. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY(/AWS_SESSION_TOKEN) (environment.h);
//   3. the "default" profile (profile.h);
//  else a source of temporary keys, fetched by the store, the first that applies of
//   4. web identity (web_identity.h), 5. container credentials (container.h),
//   6. EC2 instance metadata (imds.h), unless AWS_EC2_METADATA_DISABLED=true.
// Nothing here touches the network: the store fetches from the chosen source.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "ddp/status.h"
#include "store/s3/credentials/aws_credentials.h"
#include "store/s3/credentials/container.h"
#include "store/s3/credentials/environment.h"
#include "store/s3/credentials/http_fetch.h"
#include "store/s3/credentials/imds.h"
#include "store/s3/credentials/web_identity.h"

namespace ddp::store_internal {

using CredentialSource = std::variant<WebIdentitySource, ContainerSource, ImdsSource>;

// Steps 1-3: the fixed keys; nullopt when none is set. `*profile_region` gets the region
// of the profile read, if it names one. Errors name the variable or profile and `url`.
Result<std::optional<AwsCredentials>> FixedCredentials(const EnvLookup& env, std::string_view url,
                                                       std::string* profile_region);

// Steps 4-6: the source of temporary credentials the environment selects; nullopt when
// none applies. `region` picks the regional STS endpoint. Errors name the variable that
// is set wrong.
Result<std::optional<CredentialSource>> TemporaryCredentialSource(const EnvLookup& env, const std::string& region);

// One line for messages: "web identity (role arn:..., STS at https://...)".
std::string DescribeSource(const CredentialSource& source);

// Fetches credentials from `source` once (no caching). `ca_bundle` as in ClientConfig.
Result<CredentialFetch> MakeCredentialFetch(const CredentialSource& source, const std::string& ca_bundle);

// kUnauthenticated: nothing in the chain gave credentials for `url`; lists what to set.
// `why` (may be empty) says why the last resort, instance metadata, failed.
Status NoCredentialsError(std::string_view url, const EnvLookup& env, std::string_view why);

}  // namespace ddp::store_internal
