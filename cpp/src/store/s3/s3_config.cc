#include "store/s3/s3_config.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "store/key.h"
#include "store/text.h"

namespace ddp::store_internal {
namespace {

std::string HomeFile(const EnvLookup& env, const char* override_var, const char* rel) {
  std::string p = EnvOrEmpty(env, override_var);
  if (!p.empty()) return p;
  std::string home = EnvOrEmpty(env, "HOME");
  return home.empty() ? std::string() : home + "/" + rel;
}

bool ValidBucketName(std::string_view b) {
  if (b.empty() || b.size() > 255) return false;
  for (char c : b) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) {
      return false;
    }
  }
  return true;
}

// Credentials (and region) from one profile of the shared files, if it has them.
Result<std::optional<S3Credentials>> ProfileCredentials(const EnvLookup& env,
                                                        const std::string& profile,
                                                        std::string* region, bool* found) {
  std::string cred_file = HomeFile(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
  std::string conf_file = HomeFile(env, "AWS_CONFIG_FILE", ".aws/config");
  std::optional<S3Credentials> creds;
  *found = false;
  auto take = [&](const std::map<std::string, std::string>& kv, const std::string& file) {
    *found = true;
    auto k = kv.find("aws_access_key_id");
    auto s = kv.find("aws_secret_access_key");
    if (!creds && k != kv.end() && s != kv.end()) {
      S3Credentials c{k->second, s->second, "", "profile '" + profile + "' in " + file, {}};
      if (auto t = kv.find("aws_session_token"); t != kv.end()) c.session_token = t->second;
      creds = std::move(c);
    }
    if (auto r = kv.find("region"); r != kv.end() && region->empty()) *region = r->second;
  };
  if (!cred_file.empty()) {
    DDP_ASSIGN_OR_RETURN(auto sec, ReadIniSection(cred_file, profile));
    if (sec) take(*sec, cred_file);
  }
  if (!conf_file.empty()) {
    // The config file names sections "[profile x]", except "[default]".
    std::string section = profile == "default" ? profile : "profile " + profile;
    DDP_ASSIGN_OR_RETURN(auto sec, ReadIniSection(conf_file, section));
    if (sec) take(*sec, conf_file);
  }
  return creds;
}

}  // namespace

Status NoCredentialsError(std::string_view url, const EnvLookup& env, std::string_view why) {
  std::string m =
      "no AWS credentials for " + RedactUrl(url) +
      ": set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a shared "
      "credentials file (looked for [default] in " +
      HomeFile(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials") +
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

std::string S3Config::BucketUrl() const {
  if (path_style) return endpoint + "/" + bucket;
  size_t sep = endpoint.find("://");
  return endpoint.substr(0, sep + 3) + bucket + "." + endpoint.substr(sep + 3);
}

EnvLookup ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Result<std::optional<std::map<std::string, std::string>>> ReadIniSection(
    const std::string& path, const std::string& section) {
  std::ifstream in(path);
  if (!in) {
    if (errno == ENOENT) return std::optional<std::map<std::string, std::string>>();
    return PermissionDeniedError(path + ": cannot read: " + std::strerror(errno));
  }
  std::optional<std::map<std::string, std::string>> out;
  bool inside = false;
  std::string line;
  while (std::getline(in, line)) {
    std::string_view l = Trim(line);
    if (l.empty() || l.front() == '#' || l.front() == ';') continue;
    if (l.front() == '[' && l.back() == ']') {
      inside = Trim(l.substr(1, l.size() - 2)) == section;
      if (inside && !out) out.emplace();
      continue;
    }
    if (!inside) continue;
    size_t eq = l.find('=');
    if (eq == std::string_view::npos) continue;
    (*out)[std::string(Trim(l.substr(0, eq)))] = std::string(Trim(l.substr(eq + 1)));
  }
  return out;
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

  std::string profile = EnvOrEmpty(env, "AWS_PROFILE");
  std::string profile_region;
  c.region = !options.region.empty() ? options.region : EnvOrEmpty(env, "AWS_REGION");
  if (c.region.empty()) c.region = EnvOrEmpty(env, "AWS_DEFAULT_REGION");

  if (!options.anonymous) {
    std::string key = EnvOrEmpty(env, "AWS_ACCESS_KEY_ID"), secret = EnvOrEmpty(env, "AWS_SECRET_ACCESS_KEY");
    if (!profile.empty()) {
      bool found = false;
      DDP_ASSIGN_OR_RETURN(c.credentials,
                           ProfileCredentials(env, profile, &profile_region, &found));
      if (!c.credentials) {
        return UnauthenticatedError(
            "AWS_PROFILE='" + profile + "' " +
            (found ? "has no aws_access_key_id/aws_secret_access_key"
                   : "is not in the shared credentials or config file") +
            " (looked in " +
            HomeFile(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials") + " and " +
            HomeFile(env, "AWS_CONFIG_FILE", ".aws/config") + ") for " + RedactUrl(url));
      }
    } else if (!key.empty() || !secret.empty()) {
      if (key.empty() || secret.empty()) {
        std::string unset = key.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY";
        std::string set = key.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID";
        return UnauthenticatedError(unset + " is not set but " + set + " is, for " +
                                    RedactUrl(url));
      }
      c.credentials =
          S3Credentials{key, secret, EnvOrEmpty(env, "AWS_SESSION_TOKEN"), "environment", {}};
    } else {
      bool found = false;
      DDP_ASSIGN_OR_RETURN(c.credentials,
                           ProfileCredentials(env, "default", &profile_region, &found));
    }
  } else if (!profile.empty()) {
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
