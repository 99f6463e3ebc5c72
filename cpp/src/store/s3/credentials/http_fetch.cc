#include "store/s3/credentials/http_fetch.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ddp/store.h"
#include "store/s3/flat_json.h"
#include "store/text.h"

namespace ddp::store_internal {
namespace {

constexpr size_t kMaxShownMessage = 300;

}  // namespace

Status CheckHttpUrl(const std::string& url, const char* var) {
  if (!url.starts_with("http://") && !url.starts_with("https://")) {
    return InvalidArgumentError(std::string(var) + "='" + RedactUrl(url) +
                                "' must start with http:// or https://");
  }
  return Status::Ok();
}

std::string WithoutTrailingSlash(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

ClientConfig FetchClientConfig(const std::string& ca_bundle, double connect_timeout_s, int attempts) {
  ClientConfig cfg;
  cfg.retry.max_attempts = attempts;
  cfg.retry.initial_backoff_s = 0.1;
  cfg.retry.max_backoff_s = 1.0;
  cfg.connect_timeout_s = connect_timeout_s;
  cfg.low_speed_timeout_s = std::max(2.0, 2 * connect_timeout_s);
  cfg.ca_bundle = ca_bundle;
  cfg.max_body_bytes = 1u << 20;  // a credential answer is a few hundred bytes
  return cfg;
}

Result<std::string> ReadSecretFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return UnauthenticatedError(std::string(what) + " " + path + ": cannot read: " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text(Trim(ss.str()));
  if (text.empty()) return UnauthenticatedError(std::string(what) + " " + path + ": empty");
  return text;
}

std::string Shown(std::string text, std::string_view secret) {
  if (!secret.empty()) {
    for (size_t p = text.find(secret); p != std::string::npos; p = text.find(secret, p)) {
      text.replace(p, secret.size(), "<redacted>");
    }
  }
  if (text.size() > kMaxShownMessage) text = text.substr(0, kMaxShownMessage) + "...";
  return text;
}

Code CodeForCredentialAnswer(long status) {
  if (status >= 500 || status == 429) return Code::kUnavailable;
  if (status == 404) return Code::kNotFound;
  return Code::kUnauthenticated;
}

Status JsonAnswerError(const std::string& what, const HttpResponse& resp, std::string_view secret) {
  std::string m = what + ": HTTP " + std::to_string(resp.status);
  auto fields = ParseFlatJsonObject(resp.body);
  if (fields.ok()) {
    for (const char* k : {"code", "Code"}) {
      if (auto it = fields->find(k); it != fields->end()) m += " " + Shown(it->second, secret);
    }
    for (const char* k : {"message", "Message"}) {
      if (auto it = fields->find(k); it != fields->end()) m += ": " + Shown(it->second, secret);
    }
  }
  return Status(CodeForCredentialAnswer(resp.status), m);
}

Result<AwsCredentials> ParseCredentialsJson(std::string_view json, std::string_view what) {
  auto parsed = ParseFlatJsonObject(json);
  if (!parsed.ok()) {
    return DataLossError(std::string(what) + ": the credentials answer is not a JSON object (" +
                         parsed.status().message() + ")");
  }
  const auto& f = *parsed;
  auto field = [&](const char* name) {
    auto it = f.find(name);
    return it == f.end() ? std::string() : it->second;
  };
  if (auto code = f.find("Code"); code != f.end() && code->second != "Success") {
    std::string m = std::string(what) + ": the answer's Code is '" + Shown(code->second, "") + "'";
    if (std::string msg = field("Message"); !msg.empty()) m += ": " + Shown(msg, "");
    return UnauthenticatedError(m);
  }
  AwsCredentials c;
  c.access_key = field("AccessKeyId");
  c.secret_key = field("SecretAccessKey");
  c.session_token = field("Token");
  if (c.access_key.empty() || c.secret_key.empty()) {
    return DataLossError(std::string(what) + ": the credentials answer has no AccessKeyId or SecretAccessKey");
  }
  if (std::string e = field("Expiration"); !e.empty()) {
    DDP_ASSIGN_OR_RETURN(c.expiration, ParseIso8601(e, what));
  }
  return c;
}

}  // namespace ddp::store_internal
