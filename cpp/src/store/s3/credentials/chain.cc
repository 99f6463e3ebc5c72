#include "store/s3/credentials/chain.h"

#include "ddp/store.h"
#include "store/s3/credentials/profile.h"

namespace ddp::store_internal {

Result<std::optional<AwsCredentials>> FixedCredentials(const EnvLookup& env, std::string_view url,
                                                       std::string* profile_region) {
  if (std::string profile = EnvOrEmpty(env, "AWS_PROFILE"); !profile.empty()) {
    DDP_ASSIGN_OR_RETURN(AwsCredentials named, NamedProfileCredentials(env, profile, url, profile_region));
    return std::optional<AwsCredentials>(std::move(named));
  }
  DDP_ASSIGN_OR_RETURN(std::optional<AwsCredentials> from_env, EnvironmentCredentials(env, url));
  if (from_env) return from_env;
  bool found = false;
  return ProfileCredentials(env, "default", profile_region, &found);
}

Result<std::optional<CredentialSource>> TemporaryCredentialSource(const EnvLookup& env, const std::string& region) {
  DDP_ASSIGN_OR_RETURN(std::optional<WebIdentitySource> web, WebIdentitySourceFromEnv(env, region));
  if (web) return std::optional<CredentialSource>(std::move(*web));
  DDP_ASSIGN_OR_RETURN(std::optional<ContainerSource> container, ContainerSourceFromEnv(env));
  if (container) return std::optional<CredentialSource>(std::move(*container));
  DDP_ASSIGN_OR_RETURN(std::optional<ImdsSource> imds, ImdsSourceFromEnv(env));
  if (imds) return std::optional<CredentialSource>(std::move(*imds));
  return std::optional<CredentialSource>();
}

std::string DescribeSource(const CredentialSource& source) {
  return std::visit([](const auto& s) { return DescribeSource(s); }, source);
}

Result<CredentialFetch> MakeCredentialFetch(const CredentialSource& source, const std::string& ca_bundle) {
  if (const auto* w = std::get_if<WebIdentitySource>(&source)) return MakeWebIdentityFetch(*w, ca_bundle);
  if (const auto* c = std::get_if<ContainerSource>(&source)) return MakeContainerFetch(*c, ca_bundle);
  return MakeImdsFetch(std::get<ImdsSource>(source), ca_bundle);
}

Status NoCredentialsError(std::string_view url, const EnvLookup& env, std::string_view why) {
  std::string m =
      "no AWS credentials for " + RedactUrl(url) +
      ": set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a shared "
      "credentials file (looked for [default] in " +
      SharedCredentialsFile(env) +
      "), or AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, or "
      "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI/FULL_URI, or run on EC2 with an instance "
      "profile; or open the store anonymously (anon=True) for a public bucket";
  if (!why.empty()) {
    m += " (";
    m += why;
    m += ")";
  }
  return UnauthenticatedError(std::move(m));
}

}  // namespace ddp::store_internal
