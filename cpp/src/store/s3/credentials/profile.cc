#include "store/s3/credentials/profile.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "ddp/store.h"
#include "store/text.h"

namespace ddp::store_internal {
namespace {

std::string HomeFile(const EnvLookup& env, const char* override_var, const char* rel) {
  std::string p = EnvOrEmpty(env, override_var);
  if (!p.empty()) return p;
  std::string home = EnvOrEmpty(env, "HOME");
  return home.empty() ? std::string() : home + "/" + rel;
}

}  // namespace

std::string SharedCredentialsFile(const EnvLookup& env) {
  return HomeFile(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
}

std::string SharedConfigFile(const EnvLookup& env) { return HomeFile(env, "AWS_CONFIG_FILE", ".aws/config"); }

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

Result<std::optional<AwsCredentials>> ProfileCredentials(const EnvLookup& env, const std::string& profile,
                                                         std::string* region, bool* found) {
  std::string cred_file = SharedCredentialsFile(env);
  std::string conf_file = SharedConfigFile(env);
  std::optional<AwsCredentials> creds;
  *found = false;
  auto take = [&](const std::map<std::string, std::string>& kv, const std::string& file) {
    *found = true;
    auto k = kv.find("aws_access_key_id");
    auto s = kv.find("aws_secret_access_key");
    if (!creds && k != kv.end() && s != kv.end()) {
      AwsCredentials c{k->second, s->second, "", "profile '" + profile + "' in " + file, {}};
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

Result<AwsCredentials> NamedProfileCredentials(const EnvLookup& env, const std::string& profile,
                                               std::string_view url, std::string* region) {
  bool found = false;
  DDP_ASSIGN_OR_RETURN(std::optional<AwsCredentials> creds, ProfileCredentials(env, profile, region, &found));
  if (creds) return std::move(*creds);
  return UnauthenticatedError("AWS_PROFILE='" + profile + "' " +
                              (found ? "has no aws_access_key_id/aws_secret_access_key"
                                     : "is not in the shared credentials or config file") +
                              " (looked in " + SharedCredentialsFile(env) + " and " + SharedConfigFile(env) +
                              ") for " + RedactUrl(url));
}

}  // namespace ddp::store_internal
