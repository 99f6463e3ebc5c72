#include "store/url.h"

#include <array>
#include <cctype>

#include "store/backends.h"
#include "store/text.h"

namespace ddp {
namespace store_internal {
namespace {

// The back-ends by scheme; OpenStore dispatches through this table.
constexpr std::array<Backend, 5> kBackends = {{
    {"file", &OpenFileStore, true},
    {"memory", &OpenMemoryStore, false},
    {"s3", &OpenS3Store, false},
    {"http", &OpenHttpStore, false},
    {"https", &OpenHttpStore, false},
}};

std::string SupportedSchemes() {
  std::string s;
  for (const Backend& b : kBackends) {
    s += b.scheme;
    s += "://, ";
  }
  return s + "or a plain path";
}

// RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ).
bool IsScheme(std::string_view s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') return false;
  }
  return true;
}

}  // namespace

std::span<const Backend> Backends() { return kBackends; }

const Backend* FindBackend(std::string_view scheme) {
  for (const Backend& b : kBackends) {
    if (b.scheme == scheme) return &b;
  }
  return nullptr;
}

}  // namespace store_internal

std::string RedactUrl(std::string_view url) {
  size_t sep = url.find("://");
  if (sep == std::string_view::npos) return std::string(url);
  const size_t host_start = sep + 3;
  size_t end = url.find_first_of("/?#", host_start);
  if (end == std::string_view::npos) end = url.size();
  const size_t at = url.substr(0, end).rfind('@');
  if (at == std::string_view::npos || at < host_start) return std::string(url);
  return std::string(url.substr(0, host_start)) + std::string(url.substr(at + 1));
}

Result<StoreUrl> ParseStoreUrl(std::string_view url) {
  using store_internal::FindBackend;
  if (url.empty()) return InvalidArgumentError("empty store URL");
  const size_t sep = url.find("://");
  if (sep == std::string_view::npos || !store_internal::IsScheme(url.substr(0, sep))) {
    return StoreUrl{"file", std::string(url), true};  // a plain path
  }
  StoreUrl out;
  out.scheme = store_internal::Lower(url.substr(0, sep));
  const store_internal::Backend* backend = FindBackend(out.scheme);
  if (backend == nullptr) {
    return InvalidArgumentError("unsupported URL scheme '" + out.scheme + "' in '" + RedactUrl(url) +
                                "' (supported: " + store_internal::SupportedSchemes() + ")");
  }
  out.local = backend->local;
  std::string_view rest = url.substr(sep + 3);
  if (out.scheme == "file") {
    // file:///abs/path or file://localhost/abs/path (RFC 8089); another host is remote.
    if (rest == "localhost") rest = "/";
    if (rest.starts_with("localhost/")) rest.remove_prefix(9);
    if (!rest.starts_with("/")) {
      return InvalidArgumentError("file URL '" + RedactUrl(url) +
                                  "' names a host: write file:///absolute/path (or a plain path)");
    }
    out.location = std::string(rest);
  } else if (out.scheme == "memory") {
    out.location = std::string(rest);
  } else {
    out.location = std::string(url);
  }
  return out;
}

}  // namespace ddp
