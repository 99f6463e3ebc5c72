#include "store/s3/credentials/environment.h"

#include <cstdlib>

#include "ddp/store.h"

namespace ddp::store_internal {

EnvLookup ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::string EnvOrEmpty(const EnvLookup& env, const char* name) {
  std::optional<std::string> v = env(name);
  return v.has_value() ? *v : std::string();
}

Result<std::optional<AwsCredentials>> EnvironmentCredentials(const EnvLookup& env, std::string_view url) {
  std::string key = EnvOrEmpty(env, "AWS_ACCESS_KEY_ID"), secret = EnvOrEmpty(env, "AWS_SECRET_ACCESS_KEY");
  if (key.empty() && secret.empty()) return std::optional<AwsCredentials>();
  if (key.empty() || secret.empty()) {
    std::string unset = key.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY";
    std::string set = key.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID";
    return UnauthenticatedError(unset + " is not set but " + set + " is, for " + RedactUrl(url));
  }
  return std::optional<AwsCredentials>(
      AwsCredentials{key, secret, EnvOrEmpty(env, "AWS_SESSION_TOKEN"), "environment", {}});
}

}  // namespace ddp::store_internal
