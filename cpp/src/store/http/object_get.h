// GET of a whole object or a byte range over HTTP, shared by the s3:// and http(s)://
// back-ends: the Range header, and the checks that what came back is exactly what was
// asked for (a 206's Content-Range, a 200 from a server ignoring ranges, a 416 at the
// end of the object).
#pragma once

#include <functional>
#include <string>

#include "ddp/store.h"
#include "store/http/curl_client.h"

namespace ddp::store_internal {

// Adds "Range: bytes=a-b" for a partial range (nothing for a whole object).
void AddRangeHeader(const ByteRange& range, HttpRequest* request);

// The object's size from "Content-Range: bytes a-b/SIZE" or "bytes */SIZE", if given.
std::optional<uint64_t> TotalFromContentRange(const HttpResponse& response);

// GETs `range` of the object `request` names. `size_of` (a HEAD) is called only when
// the size is needed and the answer did not carry it (a zero-length range, a 416
// without Content-Range).
Result<std::string> GetObjectRange(CurlClient& client, HttpRequest request, const ByteRange& range,
                                   const std::function<Result<uint64_t>()>& size_of);

// Checks a finished GET answer for `range` and returns its bytes (see GetObjectRange).
// A 416 is returned as kOutOfRange carrying no size; GetObjectRange resolves it.
Result<std::string> BodyForRange(const CurlClient& client, const HttpRequest& request,
                                 HttpResponse&& response, const ByteRange& range);

// The size announced by a HEAD answer's Content-Length.
Result<uint64_t> ContentLength(const HttpRequest& request, const HttpResponse& response);

}  // namespace ddp::store_internal
