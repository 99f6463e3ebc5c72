#include "store/s3/s3_config.h"

#include <cctype>

#include "store/key.h"
#include "store/s3/credentials/profile.h"

namespace ddp::store_internal {
namespace {

bool ValidBucketName(std::string_view b) {
  if (b.empty() || b.size() > 255) return false;
  for (char c : b) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string S3Config::BucketUrl() const {
  if (path_style) return endpoint + "/" + bucket;
  size_t sep = endpoint.find("://");
  return endpoint.substr(0, sep + 3) + bucket + "." + endpoint.substr(sep + 3);
}

Result<S3Config> ResolveS3Config(std::string_view url, const StoreOptions& options,
                                 const EnvLookup& env) {
  S3Config c;
  std::string_view rest = url.substr(url.find("://") + 3);
  size_t slash = rest.find('/');
  c.bucket = std::string(rest.substr(0, slash));
  if (!ValidBucketName(c.bucket)) {
    return InvalidArgumentError("invalid bucket name '" + RedactUrl("s3://" + c.bucket).substr(5) +
                                "' in S3 URL '" + RedactUrl(url) + "' (expected s3://bucket[/prefix])");
  }
  if (slash != std::string_view::npos) {
    std::string_view p = rest.substr(slash + 1);
    while (!p.empty() && p.back() == '/') p.remove_suffix(1);
    c.prefix = std::string(p);
    if (!c.prefix.empty()) {
      DDP_RETURN_IF_ERROR(ValidateKey(c.prefix, url, /*strict=*/false)
                              .WithContext("invalid prefix in S3 URL"));
    }
  }

  std::string profile_region;
  c.region = !options.region.empty() ? options.region : EnvOrEmpty(env, "AWS_REGION");
  if (c.region.empty()) c.region = EnvOrEmpty(env, "AWS_DEFAULT_REGION");

  if (!options.anonymous) {
    DDP_ASSIGN_OR_RETURN(c.credentials, FixedCredentials(env, url, &profile_region));
  } else if (std::string profile = EnvOrEmpty(env, "AWS_PROFILE"); !profile.empty()) {
    // Anonymous requests sign nothing, but still go to the profile's region.
    bool found = false;
    DDP_RETURN_IF_ERROR(ProfileCredentials(env, profile, &profile_region, &found).status());
  }
  if (c.region.empty()) c.region = profile_region;
  if (c.region.empty()) c.region = "us-east-1";
  if (!options.anonymous && !c.credentials) {
    // Nothing fixed: the temporary sources of where workloads run (EKS, ECS, EC2).
    DDP_ASSIGN_OR_RETURN(c.credential_source, TemporaryCredentialSource(env, c.region));
    if (!c.credential_source) return NoCredentialsError(url, env, "");
  }

  std::string endpoint = options.endpoint_url;
  if (endpoint.empty()) endpoint = EnvOrEmpty(env, "AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = EnvOrEmpty(env, "AWS_ENDPOINT_URL");
  if (!endpoint.empty()) {
    while (endpoint.size() > 1 && endpoint.back() == '/') endpoint.pop_back();
    if (!endpoint.starts_with("http://") && !endpoint.starts_with("https://")) {
      return InvalidArgumentError("S3 endpoint URL '" + RedactUrl(endpoint) +
                                  "' must start with http:// or https://");
    }
    c.endpoint = endpoint;
    c.path_style = true;  // custom endpoints (MinIO, moto, Ceph...) expect path style
  } else {
    c.endpoint = "https://s3." + c.region + ".amazonaws.com";
    // A dotted bucket name breaks the TLS wildcard certificate of virtual hosts.
    c.path_style = c.bucket.find('.') != std::string::npos;
  }
  return c;
}

}  // namespace ddp::store_internal
