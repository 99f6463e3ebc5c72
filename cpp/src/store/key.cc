#include "store/key.h"

#include <algorithm>

namespace ddp::store_internal {

Status ValidateKey(std::string_view key, std::string_view store_url, bool strict) {
  auto bad = [&](std::string_view why) {
    std::string m = "invalid key '";
    for (char c : key) m += (c == '\0') ? '?' : c;
    m += "' for store ";
    m += store_url;
    m += ": ";
    m += why;
    return InvalidArgumentError(std::move(m));
  };
  if (key.empty()) return bad("empty key");
  if (key.find('\0') != std::string_view::npos) return bad("contains a NUL byte");
  if (!strict) return Status::Ok();
  if (key.front() == '/') return bad("starts with '/' (keys are relative to the store root)");
  if (key.find('\\') != std::string_view::npos) return bad("contains '\\'");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view seg = key.substr(start, end - start);
    if (seg.empty()) return bad("has an empty path segment");
    if (seg == "." || seg == "..") return bad("has a '.' or '..' path segment");
    start = end + 1;
  }
  return Status::Ok();
}

Result<ResolvedRange> ResolveRange(const ByteRange& range, uint64_t size,
                                   std::string_view key_url) {
  if (range.offset > size) {
    return OutOfRangeError(std::string(key_url) + ": byte range " + DescribeRange(range) +
                           " starts past the end of the object (size " + std::to_string(size) +
                           ")");
  }
  uint64_t avail = size - range.offset;
  uint64_t len = range.length.has_value() ? std::min(*range.length, avail) : avail;
  return ResolvedRange{range.offset, len};
}

std::string DescribeRange(const ByteRange& range) {
  std::string s = "bytes=" + std::to_string(range.offset) + "-";
  if (range.length.has_value()) {
    if (*range.length == 0) return "bytes=" + std::to_string(range.offset) + "+0";
    s += std::to_string(range.offset + *range.length - 1);
  }
  return s;
}

}  // namespace ddp::store_internal
