#include "store/s3/credentials/imds.h"

#include <cstdlib>
#include <memory>
#include <string_view>

#include "store/http/curl_client.h"
#include "store/text.h"

namespace ddp::store_internal {
namespace {

constexpr const char* kImdsTokenTtl = "21600";  // seconds; the SDKs' default

// An IMDSv2 session token, asked for with a PUT.
Result<std::string> SessionToken(const ImdsSource& src, const std::string& what, CurlClient& client) {
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
  return token;
}

Result<AwsCredentials> FetchImds(const ImdsSource& src, CurlClient& client) {
  std::string what = "EC2 instance metadata at " + src.endpoint;
  DDP_ASSIGN_OR_RETURN(std::string token, SessionToken(src, what, client));
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

Result<std::optional<ImdsSource>> ImdsSourceFromEnv(const EnvLookup& env) {
  if (Lower(Trim(EnvOrEmpty(env, "AWS_EC2_METADATA_DISABLED"))) == "true") {
    return std::optional<ImdsSource>();
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
      return InvalidArgumentError("AWS_METADATA_SERVICE_TIMEOUT='" + t + "' is not a number of seconds in (0, 3600]");
    }
    imds.timeout_s = v;
  }
  if (std::string n = EnvOrEmpty(env, "AWS_METADATA_SERVICE_NUM_ATTEMPTS"); !n.empty()) {
    char* end = nullptr;
    long v = std::strtol(n.c_str(), &end, 10);
    if (end == n.c_str() || *end != '\0' || v < 1 || v > 20) {
      return InvalidArgumentError("AWS_METADATA_SERVICE_NUM_ATTEMPTS='" + n + "' is not a whole number in [1, 20]");
    }
    imds.attempts = static_cast<int>(v);
  }
  return std::optional<ImdsSource>(std::move(imds));
}

std::string DescribeSource(const ImdsSource& source) { return "EC2 instance metadata at " + source.endpoint; }

Result<CredentialFetch> MakeImdsFetch(const ImdsSource& source, const std::string& ca_bundle) {
  ClientConfig cfg = FetchClientConfig(ca_bundle, source.timeout_s, source.attempts);
  cfg.no_proxy = true;
  DDP_ASSIGN_OR_RETURN(std::unique_ptr<CurlClient> c, CurlClient::Create(std::move(cfg)));
  std::shared_ptr<CurlClient> client = std::move(c);
  return CredentialFetch([src = source, client] { return FetchImds(src, *client); });
}

}  // namespace ddp::store_internal
