#include "store/http/object_get.h"

#include <cstdlib>

#include "store/key.h"

namespace ddp::store_internal {
namespace {

bool ParseU64(std::string_view s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

// Parses "bytes FIRST-LAST/TOTAL" (TOTAL may be '*').
bool ParseContentRange(std::string_view v, uint64_t* first, uint64_t* last,
                       std::optional<uint64_t>* total) {
  if (!v.starts_with("bytes ")) return false;
  v.remove_prefix(6);
  size_t dash = v.find('-'), slash = v.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || dash > slash) {
    return false;
  }
  if (!ParseU64(v.substr(0, dash), first) ||
      !ParseU64(v.substr(dash + 1, slash - dash - 1), last)) {
    return false;
  }
  std::string_view t = v.substr(slash + 1);
  uint64_t tv = 0;
  if (t == "*") {
    total->reset();
  } else if (ParseU64(t, &tv)) {
    *total = tv;
  } else {
    return false;
  }
  return *last >= *first;
}

}  // namespace

void AddRangeHeader(const ByteRange& range, HttpRequest* request) {
  if (range.IsFull()) return;
  std::string h = "Range: bytes=" + std::to_string(range.offset) + "-";
  if (range.length.has_value()) h += std::to_string(range.offset + *range.length - 1);
  request->headers.push_back(std::move(h));
}

std::optional<uint64_t> TotalFromContentRange(const HttpResponse& response) {
  const std::string* cr = response.Header("content-range");
  if (cr == nullptr) return std::nullopt;
  std::string_view v = *cr;
  size_t slash = v.rfind('/');
  uint64_t total = 0;
  if (slash == std::string_view::npos || !ParseU64(v.substr(slash + 1), &total)) {
    return std::nullopt;
  }
  return total;
}

Result<uint64_t> ContentLength(const HttpRequest& request, const HttpResponse& response) {
  const std::string* cl = response.Header("content-length");
  uint64_t size = 0;
  if (cl == nullptr || !ParseU64(*cl, &size)) {
    return FailedPreconditionError(request.what + ": the server sent no valid Content-Length (" +
                                   request.method + " " + RedactUrl(request.url) + ")");
  }
  return size;
}

Result<std::string> BodyForRange(const CurlClient& client, const HttpRequest& request,
                                 HttpResponse&& response, const ByteRange& range) {
  long status = response.status;
  if (status == 416) {
    return OutOfRangeError(request.what + ": byte range " + DescribeRange(range) +
                           " starts past the end of the object");
  }
  if (status == 200) {
    if (range.IsFull()) return std::move(response.body);
    // The server ignored the Range header and sent the whole object: cut it here.
    DDP_ASSIGN_OR_RETURN(ResolvedRange r,
                         ResolveRange(range, response.body.size(), request.what));
    if (r.offset == 0 && r.length == response.body.size()) return std::move(response.body);
    return response.body.substr(r.offset, r.length);
  }
  if (status == 206) {
    const std::string* cr = response.Header("content-range");
    uint64_t first = 0, last = 0;
    std::optional<uint64_t> total;
    if (cr == nullptr || !ParseContentRange(*cr, &first, &last, &total)) {
      return DataLossError(request.what + ": partial answer without a valid Content-Range (" +
                           (cr ? "'" + *cr + "'" : std::string("none")) + ") for " +
                           DescribeRange(range));
    }
    uint64_t want = last - first + 1;
    bool length_ok = !range.length.has_value() || want <= *range.length;
    if (total.has_value() && range.length.has_value()) {
      length_ok = want == std::min(*range.length, *total - std::min(*total, range.offset));
    } else if (total.has_value()) {
      length_ok = last + 1 == *total;
    }
    if (first != range.offset || !length_ok || response.body.size() != want) {
      return DataLossError(request.what + ": asked for " + DescribeRange(range) +
                           ", got Content-Range '" + *cr + "' with " +
                           std::to_string(response.body.size()) + " bytes");
    }
    return std::move(response.body);
  }
  if (status / 100 == 2) {
    return FailedPreconditionError(request.what + ": unexpected HTTP " + std::to_string(status) +
                                   " to a GET (" + RedactUrl(request.url) + ")");
  }
  return client.ErrorFor(request, response);
}

Result<std::string> GetObjectRange(CurlClient& client, HttpRequest request, const ByteRange& range,
                                   const std::function<Result<uint64_t>()>& size_of) {
  if (range.length.has_value() && *range.length == 0) {
    DDP_ASSIGN_OR_RETURN(uint64_t size, size_of());
    DDP_RETURN_IF_ERROR(ResolveRange(range, size, request.what).status());
    return std::string();
  }
  AddRangeHeader(range, &request);
  DDP_ASSIGN_OR_RETURN(HttpResponse response, client.Perform(request));
  if (response.status != 416) return BodyForRange(client, request, std::move(response), range);
  // Past the end, or exactly at it (S3 answers 416 there too, where a read of the empty
  // rest should succeed): settle which with the object's size.
  std::optional<uint64_t> total = TotalFromContentRange(response);
  if (!total.has_value()) {
    DDP_ASSIGN_OR_RETURN(uint64_t size, size_of());
    total = size;
  }
  DDP_RETURN_IF_ERROR(ResolveRange(range, *total, request.what).status());
  return std::string();
}

}  // namespace ddp::store_internal
