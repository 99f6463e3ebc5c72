#include "store/s3/s3_xml.h"

#include <pugixml.hpp>

#include <cstdlib>

namespace ddp::store_internal {
namespace {

Status BadXml(std::string_view what, std::string_view why) {
  return DataLossError(std::string(what) + ": malformed S3 answer: " + std::string(why));
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

Result<ListPage> ParseListObjectsV2(std::string_view xml, std::string_view what) {
  pugi::xml_document doc;
  pugi::xml_parse_result parsed = doc.load_buffer(xml.data(), xml.size());
  if (!parsed) return BadXml(what, parsed.description());
  pugi::xml_node root = doc.child("ListBucketResult");
  if (!root) return BadXml(what, "no ListBucketResult element");
  ListPage page;
  for (pugi::xml_node c = root.child("Contents"); c; c = c.next_sibling("Contents")) {
    pugi::xml_node key = c.child("Key");
    pugi::xml_node size = c.child("Size");
    if (!key || !size) return BadXml(what, "a Contents element without Key or Size");
    const char* size_text = size.child_value();
    char* end = nullptr;
    unsigned long long n = std::strtoull(size_text, &end, 10);
    if (end == size_text || *end != '\0') {
      return BadXml(what, std::string("bad Size '") + size_text + "'");
    }
    page.objects.push_back({key.child_value(), n});
  }
  page.truncated = std::string_view(root.child("IsTruncated").child_value()) == "true";
  page.next_token = root.child("NextContinuationToken").child_value();
  if (page.truncated && page.next_token.empty()) {
    return BadXml(what, "IsTruncated without NextContinuationToken");
  }
  return page;
}

bool ParseS3Error(std::string_view xml, std::string* code, std::string* message) {
  if (xml.find("<Error") == std::string_view::npos) return false;
  pugi::xml_document doc;
  if (!doc.load_buffer(xml.data(), xml.size())) return false;
  pugi::xml_node err = doc.child("Error");
  if (!err) return false;
  *code = err.child("Code").child_value();
  *message = err.child("Message").child_value();
  return true;
}

Result<std::string> ParseUploadId(std::string_view xml, std::string_view what) {
  pugi::xml_document doc;
  pugi::xml_parse_result parsed = doc.load_buffer(xml.data(), xml.size());
  if (!parsed) return BadXml(what, parsed.description());
  std::string id = doc.child("InitiateMultipartUploadResult").child("UploadId").child_value();
  if (id.empty()) return BadXml(what, "no UploadId in InitiateMultipartUploadResult");
  return id;
}

std::string CompleteMultipartXml(const std::vector<std::pair<int, std::string>>& parts) {
  std::string x = "<CompleteMultipartUpload>";
  for (const auto& [n, etag] : parts) {
    x += "<Part><PartNumber>" + std::to_string(n) + "</PartNumber><ETag>" + XmlEscape(etag) +
         "</ETag></Part>";
  }
  x += "</CompleteMultipartUpload>";
  return x;
}

}  // namespace ddp::store_internal
