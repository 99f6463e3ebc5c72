// A libcurl client shared by the network back-ends (s3://, http(s)://).
//
// One CurlClient per store. Single requests run on pooled easy handles (each keeps its
// connections alive between requests); batches run on pooled multi handles, many
// transfers in flight over reused connections. DNS and TLS sessions are shared through
// one CURLSH. Every request is retried under the store's RetryOptions on transport
// failures (reset, timeout, refused, truncated body) and on the answers
// ClientConfig::retryable_answer picks (by default 500/502/503/504 and 429), with
// jittered exponential back-off; other answers are returned to the caller.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/process.h"
#include "ddp/store.h"

namespace ddp::store_internal {

struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string url;             // full URL; never carries credentials (see ClientConfig)
  std::string what;            // what messages name, e.g. "s3://bucket/key"
  std::vector<std::string> headers;  // "Name: value"
  std::string_view body;             // PUT/POST payload; must outlive the request
};

struct HttpResponse {
  long status = 0;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  // The value of a header (lower-case name), or nullptr.
  const std::string* Header(std::string_view lower_name) const;
};

// Keys to sign requests with; a session token goes in x-amz-security-token.
struct SigningKeys {
  std::string access_key;
  std::string secret_key;
  std::string session_token;
};

struct ClientConfig {
  RetryOptions retry;
  double connect_timeout_s = 10.0;
  double low_speed_timeout_s = 30.0;
  // The largest answer body accepted (StoreOptions::max_body_bytes): a larger
  // Content-Length, or more bytes received, aborts the transfer with kResourceExhausted
  // naming the URL and the limit (not retried).
  uint64_t max_body_bytes = 2ull << 30;
  // Signs each attempt of a request (s3:// sets it: store/s3/sigv4.h, not libcurl's
  // CURLOPT_AWS_SIGV4, which derives the signing key again for every request). Given the
  // request, the headers it carries ("Name: value") and the keys, returns the headers to
  // add (e.g. Host, x-amz-date, Authorization). Unset: requests go unsigned.
  std::function<Result<std::vector<std::string>>(const HttpRequest& request,
                                                 const std::vector<std::string>& headers,
                                                 const SigningKeys& keys)>
      sign;
  // With sign: the keys to sign with, asked for before every attempt so temporary
  // credentials can be refreshed between requests. An error fails the request (not
  // retried). Keys never appear in messages.
  std::function<Result<SigningKeys>()> signing_keys;
  std::vector<std::string> extra_headers;  // added to every request
  std::string ca_bundle;                   // CURLOPT_CAINFO when not empty
  // Never through a proxy (http_proxy, ...): for link-local credential agents, whose
  // answers are secrets and which a proxy cannot reach anyway.
  bool no_proxy = false;
  // Builds the Status for a non-2xx answer; the default names request.what, the HTTP
  // status and the method. S3 replaces it to add the error code from the XML body.
  std::function<Status(const HttpRequest&, const HttpResponse&)> http_error;
  // Whether a non-2xx answer is worth another attempt; the default is
  // IsRetryableHttpStatus. S3 replaces it to look at the error code in the body.
  std::function<bool(const HttpResponse&)> retryable_answer;
};

// The transport settings of a store's options (retry, timeouts, CA bundle, body limit).
ClientConfig ClientConfigFor(const StoreOptions& options);

// The Status code for an HTTP status (404 -> kNotFound, 403 -> kPermissionDenied, ...).
Code CodeForHttpStatus(long status);
// "<what>: HTTP 404 (GET http://host/x)" with `detail` appended when not empty.
Status HttpStatusError(const HttpRequest& request, long status, std::string_view detail);

// Percent-encodes `s` as AWS and RFC 3986 want: unreserved characters kept, everything
// else %XX (upper-case hex); '/' kept when `keep_slash`.
std::string UriEncode(std::string_view s, bool keep_slash);

class CurlClient {
 public:
  // A client for `config`; an empty config.ca_bundle is taken from AWS_CA_BUNDLE.
  static Result<std::unique_ptr<CurlClient>> Create(ClientConfig config);
  ~CurlClient();
  CurlClient(const CurlClient&) = delete;
  CurlClient& operator=(const CurlClient&) = delete;

  // In a fork()ed child of the process that made the client, requests fail with
  // kOtherProcess (the pooled handles hold the parent's connections), and the destructor
  // leaks the handles (common/process.h).

  // One request, retried as described above. An error means a transport failure or a
  // retryable answer that persisted; any other answer is returned, whatever its status.
  Result<HttpResponse> Perform(const HttpRequest& request);

  // Many requests, up to `max_in_flight` at once, each retried on its own. `done` is
  // called once per request in completion order, on the calling thread, never
  // concurrently. Returns when all are done, or, once `*cancel` is true, after calling
  // `done` with kCancelled for every request not done yet (returning kCancelled).
  using DoneCallback = std::function<void(size_t index, Result<HttpResponse> response)>;
  Status PerformMany(std::span<const HttpRequest> requests, int max_in_flight,
                     const DoneCallback& done, const std::atomic<bool>* cancel = nullptr);

  // The Status for a non-2xx answer (config.http_error or the default).
  Status ErrorFor(const HttpRequest& request, const HttpResponse& response) const;

  const ClientConfig& config() const { return config_; }

 private:
  struct Impl;
  explicit CurlClient(ClientConfig config);
  Status CheckProcess(const std::string& what) const;  // kOtherProcess naming `what`
  ProcessOwner owner_;
  ClientConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::store_internal
