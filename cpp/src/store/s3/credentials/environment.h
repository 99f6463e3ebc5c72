// The process environment as the credential chain reads it, and the fixed keys it may
// hold: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN for
// temporary ones).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/status.h"
#include "store/s3/credentials/aws_credentials.h"

namespace ddp::store_internal {

// Reads an environment variable; tests inject their own.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// The lookup of this process's environment (getenv).
EnvLookup ProcessEnv();

// The variable's value, or "" when it is not set.
std::string EnvOrEmpty(const EnvLookup& env, const char* name);

// The keys of AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY(/AWS_SESSION_TOKEN), source
// "environment"; nullopt when neither is set. kUnauthenticated names the one missing
// when only the other is set, and `url` (redacted) the store they were for.
Result<std::optional<AwsCredentials>> EnvironmentCredentials(const EnvLookup& env, std::string_view url);

}  // namespace ddp::store_internal
