#include "store/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>
#include <ctime>

#include "store/text.h"

namespace ddp::store_internal {
namespace {

constexpr char kHex[] = "0123456789abcdef";
constexpr char kHexUpper[] = "0123456789ABCDEF";

std::string Hex(const uint8_t* p, size_t n) {
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 15];
  }
  return out;
}

bool IsHex(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

bool Unreserved(unsigned char c) {
  return std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
}

// RFC 3986 encoding that keeps escapes already present (%xx, hex upper-cased): the
// request line is sent already encoded and S3 signs it as sent.
void AppendEncoded(std::string_view s, bool keep_slash, std::string& out) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (Unreserved(c) || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else if (c == '%' && i + 2 < s.size() && IsHex(s[i + 1]) && IsHex(s[i + 2])) {
      out += '%';
      out += static_cast<char>(std::toupper(static_cast<unsigned char>(s[i + 1])));
      out += static_cast<char>(std::toupper(static_cast<unsigned char>(s[i + 2])));
      i += 2;
    } else {
      out += '%';
      out += kHexUpper[c >> 4];
      out += kHexUpper[c & 15];
    }
  }
}

std::string CanonicalQuery(std::string_view query) {
  std::vector<std::pair<std::string, std::string>> params;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view part = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    std::pair<std::string, std::string> p;
    AppendEncoded(part.substr(0, eq), false, p.first);
    if (eq != std::string_view::npos) AppendEncoded(part.substr(eq + 1), false, p.second);
    params.push_back(std::move(p));
  }
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [k, v] : params) {
    if (!out.empty()) out += '&';
    out += k;
    out += '=';
    out += v;
  }
  return out;
}

// A header value as SigV4 signs it: trimmed, inner runs of spaces made one.
std::string CanonicalValue(std::string_view v) {
  v = Trim(v);
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == ' ' && !out.empty() && out.back() == ' ') continue;
    out += c;
  }
  return out;
}

bool Hmac(const uint8_t* key, size_t key_len, std::string_view data, uint8_t out[32]) {
  unsigned int len = 0;
  return HMAC(EVP_sha256(), key, static_cast<int>(key_len), reinterpret_cast<const uint8_t*>(data.data()),
              data.size(), out, &len) != nullptr &&
         len == 32;
}

bool ValidAmzDate(std::string_view d) {
  if (d.size() != 16 || d[8] != 'T' || d[15] != 'Z') return false;
  for (size_t i = 0; i < 15; ++i) {
    if (i != 8 && !std::isdigit(static_cast<unsigned char>(d[i]))) return false;
  }
  return true;
}

}  // namespace

std::string AmzDate(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[20];
  const size_t n = std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return std::string(buf, n);
}

std::string Sha256Hex(std::string_view data) {
  uint8_t md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const uint8_t*>(data.data()), data.size(), md);
  return Hex(md, sizeof md);
}

SigV4Signer::SigV4Signer(std::string region, std::string service)
    : region_(std::move(region)), service_(std::move(service)) {}

uint64_t SigV4Signer::derivations() const {
  std::lock_guard<std::mutex> g(mu_);
  return derivations_;
}

Status SigV4Signer::KeyFor(std::string_view date, const std::string& secret, std::array<uint8_t, 32>& key) {
  std::lock_guard<std::mutex> g(mu_);
  if (derivations_ > 0 && cached_date_ == date && cached_secret_ == secret) {
    key = cached_key_;
    return Status::Ok();
  }
  const std::string k0 = "AWS4" + secret;
  uint8_t k_date[32], k_region[32], k_service[32];
  if (!Hmac(reinterpret_cast<const uint8_t*>(k0.data()), k0.size(), date, k_date) ||
      !Hmac(k_date, 32, region_, k_region) || !Hmac(k_region, 32, service_, k_service) ||
      !Hmac(k_service, 32, "aws4_request", key.data())) {
    return InternalError("SigV4: HMAC-SHA256 failed in libcrypto");
  }
  cached_date_ = std::string(date);
  cached_secret_ = secret;
  cached_key_ = key;
  ++derivations_;
  return Status::Ok();
}

Result<SigV4Result> SigV4Signer::Sign(const SigV4Request& r, const SigV4Keys& keys, std::string_view amz_date) {
  if (!ValidAmzDate(amz_date)) {
    return InvalidArgumentError("SigV4: malformed x-amz-date '" + std::string(amz_date) + "'");
  }
  // Canonical headers: lower-case names, sorted (stable: a repeated name keeps its
  // values' order), repeated names joined.
  std::vector<std::pair<std::string, std::string>> h;
  h.reserve(r.headers.size() + 3);
  h.emplace_back("host", CanonicalValue(r.host));
  h.emplace_back("x-amz-date", std::string(amz_date));
  if (!keys.session_token.empty()) h.emplace_back("x-amz-security-token", keys.session_token);
  for (const auto& [name, value] : r.headers) {
    std::string lower = Lower(Trim(name));
    if (lower.empty()) return InvalidArgumentError("SigV4: a header to sign has an empty name");
    h.emplace_back(std::move(lower), CanonicalValue(value));
  }
  std::stable_sort(h.begin(), h.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string canonical_headers, signed_headers;
  for (size_t i = 0; i < h.size(); ++i) {
    if (i > 0 && h[i].first == h[i - 1].first) {
      canonical_headers.back() = ',';  // replaces the previous value's '\n'
    } else {
      if (!signed_headers.empty()) signed_headers += ';';
      signed_headers += h[i].first;
      canonical_headers += h[i].first;
      canonical_headers += ':';
    }
    canonical_headers += h[i].second;
    canonical_headers += '\n';
  }

  SigV4Result out;
  out.amz_date = std::string(amz_date);
  std::string& creq = out.canonical_request;
  creq.reserve(256 + r.path.size() + r.query.size() + canonical_headers.size());
  creq += r.method;
  creq += '\n';
  AppendEncoded(r.path.empty() ? std::string_view("/") : r.path, true, creq);
  creq += '\n';
  creq += CanonicalQuery(r.query);
  creq += '\n';
  creq += canonical_headers;
  creq += '\n';
  creq += signed_headers;
  creq += '\n';
  creq += r.payload_hash;

  const std::string_view date = amz_date.substr(0, 8);
  const std::string scope = std::string(date) + "/" + region_ + "/" + service_ + "/aws4_request";
  out.string_to_sign = "AWS4-HMAC-SHA256\n" + out.amz_date + "\n" + scope + "\n" + Sha256Hex(creq);

  std::array<uint8_t, 32> key{};
  DDP_RETURN_IF_ERROR(KeyFor(date, keys.secret_key, key));
  uint8_t sig[32];
  if (!Hmac(key.data(), key.size(), out.string_to_sign, sig)) {
    return InternalError("SigV4: HMAC-SHA256 failed in libcrypto");
  }
  out.signature = Hex(sig, sizeof sig);
  out.authorization = "AWS4-HMAC-SHA256 Credential=" + keys.access_key + "/" + scope +
                      ", SignedHeaders=" + signed_headers + ", Signature=" + out.signature;
  return out;
}

}  // namespace ddp::store_internal
