#include "store/s3/credentials/container.h"

#include <cctype>
#include <memory>
#include <string_view>

#include "ddp/store.h"
#include "store/http/curl_client.h"
#include "store/text.h"

namespace ddp::store_internal {
namespace {

constexpr const char* kEcsHost = "http://169.254.170.2";

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
  return host == "localhost" || IsLoopbackIpv4(host) || host == "[::1]" || host == "169.254.170.2" ||
         host == "169.254.170.23" || host == "[fd00:ec2::23]";
}

Result<AwsCredentials> FetchContainer(const ContainerSource& src, CurlClient& client) {
  std::string token = src.auth_token;
  if (!src.auth_token_file.empty()) {
    DDP_ASSIGN_OR_RETURN(token, ReadSecretFile(src.auth_token_file, "container authorization token file"));
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

}  // namespace

Result<std::optional<ContainerSource>> ContainerSourceFromEnv(const EnvLookup& env) {
  std::string relative = EnvOrEmpty(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  std::string full = EnvOrEmpty(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI");
  if (relative.empty() && full.empty()) return std::optional<ContainerSource>();
  ContainerSource c;
  if (!relative.empty()) {  // the SDKs prefer the relative URI when both are set
    if (!relative.starts_with("/")) relative = "/" + relative;
    c.url = kEcsHost + relative;
  } else {
    DDP_RETURN_IF_ERROR(CheckHttpUrl(full, "AWS_CONTAINER_CREDENTIALS_FULL_URI"));
    if (full.starts_with("http://") && !AllowedPlainHttpHost(HostOf(full))) {
      return InvalidArgumentError("AWS_CONTAINER_CREDENTIALS_FULL_URI='" + RedactUrl(full) +
                                  "': plain http is only allowed to a loopback address or the ECS/EKS "
                                  "credential agent (169.254.170.2, 169.254.170.23); use https");
    }
    c.url = full;
  }
  c.auth_token = EnvOrEmpty(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN");
  c.auth_token_file = EnvOrEmpty(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  return std::optional<ContainerSource>(std::move(c));
}

std::string DescribeSource(const ContainerSource& source) {
  return "container credentials at " + RedactUrl(source.url);
}

Result<CredentialFetch> MakeContainerFetch(const ContainerSource& source, const std::string& ca_bundle) {
  ClientConfig cfg = FetchClientConfig(ca_bundle, 2.0, 3);
  cfg.no_proxy = source.url.starts_with("http://");  // the local / link-local agents
  DDP_ASSIGN_OR_RETURN(std::unique_ptr<CurlClient> c, CurlClient::Create(std::move(cfg)));
  std::shared_ptr<CurlClient> client = std::move(c);
  return CredentialFetch([src = source, client] { return FetchContainer(src, *client); });
}

}  // namespace ddp::store_internal
