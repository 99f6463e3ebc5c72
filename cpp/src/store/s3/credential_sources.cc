#include "store/s3/credential_sources.h"

#include <pugixml.hpp>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "store/http/curl_client.h"
#include "store/retry.h"
#include "store/s3/flat_json.h"
#include "store/text.h"

namespace ddp::store_internal {
namespace {

constexpr const char* kEcsHost = "http://169.254.170.2";
constexpr const char* kImdsTokenTtl = "21600";  // seconds; the SDKs' default
constexpr size_t kMaxShownMessage = 300;

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

// The host of "scheme://[user@]host[:port]/..." (IPv6 keeps its brackets), lower-cased.
std::string HostOf(std::string_view url) {
  size_t start = url.find("://");
  if (start == std::string_view::npos) return "";
  std::string_view rest = url.substr(start + 3);
  rest = rest.substr(0, rest.find_first_of("/?#"));
  if (size_t at = rest.rfind('@'); at != std::string_view::npos) rest.remove_prefix(at + 1);
  if (rest.starts_with("[")) return Lower(rest.substr(0, rest.find(']') + 1));
  return Lower(rest.substr(0, rest.find(':')));
}

// The SDKs accept plain http for the container endpoint only on loopback and on the
// ECS / EKS Pod Identity link-local agents: the answer is a secret.
bool IsLoopbackIpv4(const std::string& host) {
  int parts = 0, digits = 0;
  for (char c : host) {
    if (c == '.') {
      if (digits == 0) return false;
      ++parts;
      digits = 0;
    } else if (std::isdigit(static_cast<unsigned char>(c)) && ++digits <= 3) {
    } else {
      return false;
    }
  }
  return parts == 3 && digits > 0 && host.starts_with("127.");
}

bool AllowedPlainHttpHost(const std::string& host) {
  return host == "localhost" || IsLoopbackIpv4(host) || host == "[::1]" ||
         host == "169.254.170.2" || host == "169.254.170.23" || host == "[fd00:ec2::23]";
}

// A secret read from a file the platform mounts (and may rotate): whitespace trimmed.
Result<std::string> ReadSecretFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return UnauthenticatedError(std::string(what) + " " + path +
                                ": cannot read: " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text(Trim(ss.str()));
  if (text.empty()) return UnauthenticatedError(std::string(what) + " " + path + ": empty");
  return text;
}

// `text` cut to a readable length with `secret` blanked out, should a server echo it.
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

std::string NowMillis() {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                            WallClock::now().time_since_epoch())
                            .count());
}

ClientConfig FetchClientConfig(const std::string& ca_bundle, double connect_timeout_s,
                               int attempts) {
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

// ---- web identity ---------------------------------------------------------------------

Result<AwsCredentials> FetchWebIdentity(const WebIdentitySource& src, CurlClient& client) {
  DDP_ASSIGN_OR_RETURN(std::string token,
                       ReadSecretFile(src.token_file, "web identity token file"));
  std::string session = src.session_name.empty() ? "dask-ddp-" + NowMillis() : src.session_name;
  std::string body = "Action=AssumeRoleWithWebIdentity&RoleArn=" + UriEncode(src.role_arn, false) +
                     "&RoleSessionName=" + UriEncode(session, false) +
                     "&Version=2011-06-15&WebIdentityToken=" + UriEncode(token, false);
  HttpRequest req;
  req.method = "POST";  // the token travels in the body, never in a URL
  req.url = src.sts_endpoint + "/";
  req.what = "STS AssumeRoleWithWebIdentity at " + RedactUrl(src.sts_endpoint) + " for role " +
             src.role_arn;
  req.headers = {"Content-Type: application/x-www-form-urlencoded; charset=utf-8",
                 "Accept: application/xml"};
  req.body = body;
  DDP_ASSIGN_OR_RETURN(HttpResponse resp, client.Perform(req));
  if (resp.status / 100 != 2) {
    std::string code, message, m = req.what + ": HTTP " + std::to_string(resp.status);
    if (ParseStsError(resp.body, &code, &message)) {
      m += " " + code;
      if (!message.empty()) m += ": " + Shown(message, token);
    }
    return Status(CodeForCredentialAnswer(resp.status), m);
  }
  DDP_ASSIGN_OR_RETURN(AwsCredentials c, ParseAssumeRoleWithWebIdentity(resp.body, req.what));
  c.source = DescribeSource(src);
  return c;
}

// ---- container ------------------------------------------------------------------------

Status JsonAnswerError(const std::string& what, const HttpResponse& resp,
                       std::string_view secret) {
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

Result<AwsCredentials> FetchContainer(const ContainerSource& src, CurlClient& client) {
  std::string token = src.auth_token;
  if (!src.auth_token_file.empty()) {
    DDP_ASSIGN_OR_RETURN(token,
                         ReadSecretFile(src.auth_token_file, "container authorization token file"));
  }
  if (token.find_first_of("\r\n") != std::string::npos) {
    return InvalidArgumentError("the container authorization token holds a line break");
  }
  HttpRequest req;
  req.url = src.url;
  req.what = "container credentials at " + RedactUrl(src.url);
  req.headers = {"Accept: application/json"};
  if (!token.empty()) req.headers.push_back("Authorization: " + token);
  DDP_ASSIGN_OR_RETURN(HttpResponse resp, client.Perform(req));
  if (resp.status / 100 != 2) return JsonAnswerError(req.what, resp, token);
  DDP_ASSIGN_OR_RETURN(AwsCredentials c, ParseCredentialsJson(resp.body, req.what));
  c.source = DescribeSource(src);
  return c;
}

// ---- EC2 instance metadata (IMDSv2) ---------------------------------------------------

Result<AwsCredentials> FetchImds(const ImdsSource& src, CurlClient& client) {
  std::string what = "EC2 instance metadata at " + src.endpoint;
  HttpRequest put;
  put.method = "PUT";
  put.url = src.endpoint + "/latest/api/token";
  put.what = what + " (session token)";
  put.headers = {std::string("X-aws-ec2-metadata-token-ttl-seconds: ") + kImdsTokenTtl};
  DDP_ASSIGN_OR_RETURN(HttpResponse token_resp, client.Perform(put));
  if (token_resp.status / 100 != 2) return JsonAnswerError(put.what, token_resp, "");
  std::string token(Trim(token_resp.body));
  if (token.empty() || token.find_first_of("\r\n") != std::string::npos) {
    return DataLossError(put.what + ": the answer is not a session token");
  }
  std::string header = "X-aws-ec2-metadata-token: " + token;

  HttpRequest list;
  list.url = src.endpoint + "/latest/meta-data/iam/security-credentials/";
  list.what = what + " (IAM role name)";
  list.headers = {header};
  DDP_ASSIGN_OR_RETURN(HttpResponse list_resp, client.Perform(list));
  if (list_resp.status == 404) {
    return UnauthenticatedError(list.what + ": HTTP 404: no IAM role (instance profile) is "
                                "attached to this instance");
  }
  if (list_resp.status / 100 != 2) return JsonAnswerError(list.what, list_resp, token);
  std::string_view names = Trim(list_resp.body);
  std::string role(Trim(names.substr(0, names.find('\n'))));
  if (role.empty() || role.find('/') != std::string::npos) {
    return DataLossError(list.what + ": the answer is not a role name");
  }

  HttpRequest get;
  get.url = list.url + UriEncode(role, false);
  get.what = what + " (credentials of role " + role + ")";
  get.headers = {header};
  DDP_ASSIGN_OR_RETURN(HttpResponse resp, client.Perform(get));
  if (resp.status / 100 != 2) return JsonAnswerError(get.what, resp, token);
  DDP_ASSIGN_OR_RETURN(AwsCredentials c, ParseCredentialsJson(resp.body, get.what));
  c.source = DescribeSource(src) + ", role " + role;
  return c;
}

}  // namespace

std::string DescribeSource(const CredentialSource& source) {
  if (const auto* w = std::get_if<WebIdentitySource>(&source)) {
    return "web identity (role " + w->role_arn + ", token file " + w->token_file + ", STS at " +
           RedactUrl(w->sts_endpoint) + ")";
  }
  if (const auto* c = std::get_if<ContainerSource>(&source)) {
    return "container credentials at " + RedactUrl(c->url);
  }
  return "EC2 instance metadata at " + std::get<ImdsSource>(source).endpoint;
}

Result<std::optional<CredentialSource>> TemporaryCredentialSource(const EnvLookup& env,
                                                                  const std::string& region) {
  if (std::string token_file = EnvOrEmpty(env, "AWS_WEB_IDENTITY_TOKEN_FILE"); !token_file.empty()) {
    WebIdentitySource w;
    w.token_file = token_file;
    w.role_arn = EnvOrEmpty(env, "AWS_ROLE_ARN");
    if (w.role_arn.empty()) {
      return InvalidArgumentError("AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not: "
                                  "web identity credentials need the role to assume");
    }
    w.session_name = EnvOrEmpty(env, "AWS_ROLE_SESSION_NAME");
    const char* var = "AWS_ENDPOINT_URL_STS";
    std::string endpoint = EnvOrEmpty(env, var);
    if (endpoint.empty()) endpoint = EnvOrEmpty(env, var = "AWS_ENDPOINT_URL");
    if (!endpoint.empty()) {
      DDP_RETURN_IF_ERROR(CheckHttpUrl(endpoint, var));
      w.sts_endpoint = WithoutTrailingSlash(endpoint);
    } else if (region.empty()) {
      w.sts_endpoint = "https://sts.amazonaws.com";
    } else {
      w.sts_endpoint = "https://sts." + region + ".amazonaws.com" +
                       (region.starts_with("cn-") ? ".cn" : "");
    }
    return std::optional<CredentialSource>(std::move(w));
  }

  std::string relative = EnvOrEmpty(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  std::string full = EnvOrEmpty(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI");
  if (!relative.empty() || !full.empty()) {
    ContainerSource c;
    if (!relative.empty()) {  // the SDKs prefer the relative URI when both are set
      if (!relative.starts_with("/")) relative = "/" + relative;
      c.url = kEcsHost + relative;
    } else {
      DDP_RETURN_IF_ERROR(CheckHttpUrl(full, "AWS_CONTAINER_CREDENTIALS_FULL_URI"));
      if (full.starts_with("http://") && !AllowedPlainHttpHost(HostOf(full))) {
        return InvalidArgumentError(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI='" + RedactUrl(full) +
            "': plain http is only allowed to a loopback address or the ECS/EKS "
            "credential agent (169.254.170.2, 169.254.170.23); use https");
      }
      c.url = full;
    }
    c.auth_token = EnvOrEmpty(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN");
    c.auth_token_file = EnvOrEmpty(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
    return std::optional<CredentialSource>(std::move(c));
  }

  if (Lower(Trim(EnvOrEmpty(env, "AWS_EC2_METADATA_DISABLED"))) == "true") {
    return std::optional<CredentialSource>();
  }
  ImdsSource imds;
  if (std::string ep = EnvOrEmpty(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT"); !ep.empty()) {
    DDP_RETURN_IF_ERROR(CheckHttpUrl(ep, "AWS_EC2_METADATA_SERVICE_ENDPOINT"));
    imds.endpoint = WithoutTrailingSlash(ep);
  } else if (Lower(EnvOrEmpty(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE")) == "ipv6") {
    imds.endpoint = "http://[fd00:ec2::254]";
  }
  if (std::string t = EnvOrEmpty(env, "AWS_METADATA_SERVICE_TIMEOUT"); !t.empty()) {
    char* end = nullptr;
    double v = std::strtod(t.c_str(), &end);
    if (end == t.c_str() || *end != '\0' || !(v > 0) || v > 3600) {
      return InvalidArgumentError("AWS_METADATA_SERVICE_TIMEOUT='" + t +
                                  "' is not a number of seconds in (0, 3600]");
    }
    imds.timeout_s = v;
  }
  if (std::string n = EnvOrEmpty(env, "AWS_METADATA_SERVICE_NUM_ATTEMPTS"); !n.empty()) {
    char* end = nullptr;
    long v = std::strtol(n.c_str(), &end, 10);
    if (end == n.c_str() || *end != '\0' || v < 1 || v > 20) {
      return InvalidArgumentError("AWS_METADATA_SERVICE_NUM_ATTEMPTS='" + n +
                                  "' is not a whole number in [1, 20]");
    }
    imds.attempts = static_cast<int>(v);
  }
  return std::optional<CredentialSource>(std::move(imds));
}

bool ParseStsError(std::string_view xml, std::string* code, std::string* message) {
  pugi::xml_document doc;
  if (!doc.load_buffer(xml.data(), xml.size())) return false;
  pugi::xml_node err = doc.child("ErrorResponse").child("Error");
  if (!err) err = doc.child("Error");
  if (!err) return false;
  *code = err.child("Code").text().as_string();
  *message = err.child("Message").text().as_string();
  return !code->empty();
}

Result<AwsCredentials> ParseAssumeRoleWithWebIdentity(std::string_view xml,
                                                      std::string_view what) {
  auto bad = [&](std::string_view why) {
    return DataLossError(std::string(what) + ": malformed STS answer: " + std::string(why));
  };
  pugi::xml_document doc;
  pugi::xml_parse_result parsed = doc.load_buffer(xml.data(), xml.size());
  if (!parsed) return bad(parsed.description());
  pugi::xml_node creds = doc.child("AssumeRoleWithWebIdentityResponse")
                             .child("AssumeRoleWithWebIdentityResult")
                             .child("Credentials");
  if (!creds) return bad("no AssumeRoleWithWebIdentityResult/Credentials element");
  AwsCredentials c;
  c.access_key = Trim(creds.child("AccessKeyId").text().as_string());
  c.secret_key = Trim(creds.child("SecretAccessKey").text().as_string());
  c.session_token = Trim(creds.child("SessionToken").text().as_string());
  std::string expiration(Trim(creds.child("Expiration").text().as_string()));
  if (c.access_key.empty() || c.secret_key.empty() || c.session_token.empty()) {
    return bad("AccessKeyId, SecretAccessKey or SessionToken missing");
  }
  if (expiration.empty()) return bad("no Expiration");
  DDP_ASSIGN_OR_RETURN(c.expiration, ParseIso8601(expiration, what));
  return c;
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
    return DataLossError(std::string(what) +
                         ": the credentials answer has no AccessKeyId or SecretAccessKey");
  }
  if (std::string e = field("Expiration"); !e.empty()) {
    DDP_ASSIGN_OR_RETURN(c.expiration, ParseIso8601(e, what));
  }
  return c;
}

Result<CredentialFetch> MakeCredentialFetch(const CredentialSource& source,
                                            const std::string& ca_bundle) {
  if (const auto* w = std::get_if<WebIdentitySource>(&source)) {
    ClientConfig cfg = FetchClientConfig(ca_bundle, 5.0, 3);
    cfg.retryable_answer = [](const HttpResponse& r) {  // e.g. 400 IDPCommunicationError
      std::string code, message;
      ParseStsError(r.body, &code, &message);
      return IsRetryableS3Error(r.status, code);
    };
    DDP_ASSIGN_OR_RETURN(std::unique_ptr<CurlClient> c, CurlClient::Create(std::move(cfg)));
    std::shared_ptr<CurlClient> client = std::move(c);
    return CredentialFetch([src = *w, client] { return FetchWebIdentity(src, *client); });
  }
  if (const auto* k = std::get_if<ContainerSource>(&source)) {
    ClientConfig cfg = FetchClientConfig(ca_bundle, 2.0, 3);
    cfg.no_proxy = k->url.starts_with("http://");  // the local / link-local agents
    DDP_ASSIGN_OR_RETURN(std::unique_ptr<CurlClient> c, CurlClient::Create(std::move(cfg)));
    std::shared_ptr<CurlClient> client = std::move(c);
    return CredentialFetch([src = *k, client] { return FetchContainer(src, *client); });
  }
  const ImdsSource& m = std::get<ImdsSource>(source);
  ClientConfig cfg = FetchClientConfig(ca_bundle, m.timeout_s, m.attempts);
  cfg.no_proxy = true;
  DDP_ASSIGN_OR_RETURN(std::unique_ptr<CurlClient> c, CurlClient::Create(std::move(cfg)));
  std::shared_ptr<CurlClient> client = std::move(c);
  return CredentialFetch([src = m, client] { return FetchImds(src, *client); });
}

std::string EnvOrEmpty(const EnvLookup& env, const char* name) {
  std::optional<std::string> v = env(name);
  return v.has_value() ? *v : std::string();
}

}  // namespace ddp::store_internal
