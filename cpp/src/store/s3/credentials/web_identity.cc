#include "store/s3/credentials/web_identity.h"

#include <pugixml.hpp>

#include <chrono>
#include <memory>

#include "ddp/store.h"
#include "store/http/curl_client.h"
#include "store/retry.h"
#include "store/text.h"

namespace ddp::store_internal {
namespace {

std::string NowMillis() {
  return std::to_string(
      std::chrono::duration_cast<std::chrono::milliseconds>(WallClock::now().time_since_epoch()).count());
}

Result<AwsCredentials> FetchWebIdentity(const WebIdentitySource& src, CurlClient& client) {
  DDP_ASSIGN_OR_RETURN(std::string token, ReadSecretFile(src.token_file, "web identity token file"));
  std::string session = src.session_name.empty() ? "dask-ddp-" + NowMillis() : src.session_name;
  std::string body = "Action=AssumeRoleWithWebIdentity&RoleArn=" + UriEncode(src.role_arn, false) +
                     "&RoleSessionName=" + UriEncode(session, false) +
                     "&Version=2011-06-15&WebIdentityToken=" + UriEncode(token, false);
  HttpRequest req;
  req.method = "POST";  // the token travels in the body, never in a URL
  req.url = src.sts_endpoint + "/";
  req.what = "STS AssumeRoleWithWebIdentity at " + RedactUrl(src.sts_endpoint) + " for role " + src.role_arn;
  req.headers = {"Content-Type: application/x-www-form-urlencoded; charset=utf-8", "Accept: application/xml"};
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

// The STS endpoint of the environment (scheme://host[:port], no trailing '/').
Result<std::string> StsEndpoint(const EnvLookup& env, const std::string& region) {
  const char* var = "AWS_ENDPOINT_URL_STS";
  std::string endpoint = EnvOrEmpty(env, var);
  if (endpoint.empty()) endpoint = EnvOrEmpty(env, var = "AWS_ENDPOINT_URL");
  if (!endpoint.empty()) {
    DDP_RETURN_IF_ERROR(CheckHttpUrl(endpoint, var));
    return WithoutTrailingSlash(endpoint);
  }
  if (region.empty()) return std::string("https://sts.amazonaws.com");
  return "https://sts." + region + ".amazonaws.com" + (region.starts_with("cn-") ? ".cn" : "");
}

}  // namespace

Result<std::optional<WebIdentitySource>> WebIdentitySourceFromEnv(const EnvLookup& env, const std::string& region) {
  std::string token_file = EnvOrEmpty(env, "AWS_WEB_IDENTITY_TOKEN_FILE");
  if (token_file.empty()) return std::optional<WebIdentitySource>();
  WebIdentitySource w;
  w.token_file = token_file;
  w.role_arn = EnvOrEmpty(env, "AWS_ROLE_ARN");
  if (w.role_arn.empty()) {
    return InvalidArgumentError("AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not: "
                                "web identity credentials need the role to assume");
  }
  w.session_name = EnvOrEmpty(env, "AWS_ROLE_SESSION_NAME");
  DDP_ASSIGN_OR_RETURN(w.sts_endpoint, StsEndpoint(env, region));
  return std::optional<WebIdentitySource>(std::move(w));
}

std::string DescribeSource(const WebIdentitySource& source) {
  return "web identity (role " + source.role_arn + ", token file " + source.token_file + ", STS at " +
         RedactUrl(source.sts_endpoint) + ")";
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

Result<AwsCredentials> ParseAssumeRoleWithWebIdentity(std::string_view xml, std::string_view what) {
  auto bad = [&](std::string_view why) {
    return DataLossError(std::string(what) + ": malformed STS answer: " + std::string(why));
  };
  pugi::xml_document doc;
  pugi::xml_parse_result parsed = doc.load_buffer(xml.data(), xml.size());
  if (!parsed) return bad(parsed.description());
  pugi::xml_node creds =
      doc.child("AssumeRoleWithWebIdentityResponse").child("AssumeRoleWithWebIdentityResult").child("Credentials");
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

Result<CredentialFetch> MakeWebIdentityFetch(const WebIdentitySource& source, const std::string& ca_bundle) {
  ClientConfig cfg = FetchClientConfig(ca_bundle, 5.0, 3);
  cfg.retryable_answer = [](const HttpResponse& r) {  // e.g. 400 IDPCommunicationError
    std::string code, message;
    if (!ParseStsError(r.body, &code, &message)) code.clear();  // not an STS error: the status decides
    return IsRetryableS3Error(r.status, code);
  };
  DDP_ASSIGN_OR_RETURN(std::unique_ptr<CurlClient> c, CurlClient::Create(std::move(cfg)));
  std::shared_ptr<CurlClient> client = std::move(c);
  return CredentialFetch([src = source, client] { return FetchWebIdentity(src, *client); });
}

}  // namespace ddp::store_internal
