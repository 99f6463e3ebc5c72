// What the credential sources that ask a server share (web identity, container, EC2
// instance metadata): the HTTP client's settings, secrets read from files the platform
// mounts, the JSON answer of the container agent and instance metadata, and error
// messages that name the request but never quote a secret. The requests go through
// CurlClient (libcurl).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "ddp/status.h"
#include "store/http/curl_client.h"
#include "store/s3/credentials/aws_credentials.h"

namespace ddp::store_internal {

// Fetches credentials from one source once (no caching; RefreshingCredentials caches).
using CredentialFetch = std::function<Result<AwsCredentials>()>;

// kInvalidArgument unless `url` (the value of variable `var`) starts with http(s)://.
Status CheckHttpUrl(const std::string& url, const char* var);

std::string WithoutTrailingSlash(std::string s);

// The settings of a credential request: few attempts, short back-off, a small body.
ClientConfig FetchClientConfig(const std::string& ca_bundle, double connect_timeout_s, int attempts);

// A secret read from a file the platform mounts (and may rotate), whitespace trimmed;
// kUnauthenticated naming `what` and the path when it cannot be read or is empty.
Result<std::string> ReadSecretFile(const std::string& path, std::string_view what);

// `text` cut to a readable length with `secret` blanked out, should a server echo it.
std::string Shown(std::string text, std::string_view secret);

// The code of a credential server's error answer: kUnavailable (5xx, 429: retry later),
// kNotFound (404), else kUnauthenticated.
Code CodeForCredentialAnswer(long status);

// The error of a JSON answer that is not 2xx: `what`, the HTTP status and the answer's
// code and message fields (with `secret` blanked out).
Status JsonAnswerError(const std::string& what, const HttpResponse& resp, std::string_view secret);

// The container / instance metadata JSON: AccessKeyId, SecretAccessKey, Token,
// Expiration (and Code, which must be "Success" when present). Errors name `what`,
// never the body.
Result<AwsCredentials> ParseCredentialsJson(std::string_view json, std::string_view what);

}  // namespace ddp::store_internal
