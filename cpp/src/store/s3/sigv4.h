// AWS Signature Version 4 for the s3:// back-end, computed here rather than by libcurl.
//
// A reviewed exception to the architecture page's "libcurl signs": libcurl's CURLOPT_AWS_SIGV4
// derives the signing key (four chained HMAC-SHA256s over date, region, service and
// "aws4_request") again for every request and parses the request's headers to build the
// canonical request; with many small GETs that was about a third of the client's CPU per
// object (measured with perf on get_many from nginx). libcurl has no hook to cache the key, so this signer keeps the
// derived key per (date, secret) and signs with one SHA-256 and one HMAC per request.
// The crypto is OpenSSL's libcrypto (the TLS library libcurl already links).
//
// Checked against the AWS SigV4 test suite and the S3 documentation's examples
// (sigv4_test.cc) and against moto's signature check (tests/test_storage_s3*.py).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/status.h"

namespace ddp::store_internal {

struct SigV4Request {
  std::string_view method;  // "GET", "PUT", ...
  std::string_view host;    // the Host header as sent ("bucket.s3.amazonaws.com", "127.0.0.1:9000")
  // The path as on the request line. S3 signs it as it stands (no normalisation, no
  // second encoding): %XX escapes are kept (hex upper-cased), other bytes outside
  // RFC 3986's unreserved set and '/' are percent-encoded.
  std::string_view path;
  std::string_view query;  // after '?', as sent ("" for none); canonicalised and sorted
  // Headers to sign besides host and x-amz-date (names in any case; values trimmed and
  // inner runs of spaces collapsed; a repeated name joins its values with ',').
  std::vector<std::pair<std::string, std::string>> headers;
  // Hex SHA-256 of the body, or "UNSIGNED-PAYLOAD".
  std::string_view payload_hash;
};

struct SigV4Keys {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // signed as x-amz-security-token when not empty
};

// The parts of a signature, for tests and for the request's headers.
struct SigV4Result {
  std::string amz_date;           // "20150830T123600Z"
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;          // hex
  std::string authorization;      // the Authorization header's value
};

// "YYYYMMDDTHHMMSSZ" (UTC) for a time.
std::string AmzDate(std::chrono::system_clock::time_point t);

// Hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);

// Signs for one region and service; thread-safe. The derived key of the last
// (date, secret key) is cached, so requests of one day with one key skip the derivation.
class SigV4Signer {
 public:
  SigV4Signer(std::string region, std::string service);

  // Signs `r` at `amz_date` ("YYYYMMDDTHHMMSSZ"). kInvalidArgument if the date is malformed
  // or a header name is empty; kInternal if libcrypto fails.
  Result<SigV4Result> Sign(const SigV4Request& r, const SigV4Keys& keys, std::string_view amz_date);

  // How many times a signing key was derived (the cache's misses), for tests.
  uint64_t derivations() const;

 private:
  Status KeyFor(std::string_view date, const std::string& secret, std::array<uint8_t, 32>& key);

  const std::string region_, service_;
  mutable std::mutex mu_;
  std::string cached_date_, cached_secret_;
  std::array<uint8_t, 32> cached_key_{};
  uint64_t derivations_ = 0;
};

}  // namespace ddp::store_internal
