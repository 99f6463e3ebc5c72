// The XML documents of the S3 API that the s3:// back-end reads and writes.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ddp/store.h"

namespace ddp::store_internal {

struct ListPage {
  std::vector<ObjectInfo> objects;  // full keys, as the bucket has them
  bool truncated = false;
  std::string next_token;
};

// A ListObjectsV2 result page. `what` names the request in errors.
Result<ListPage> ParseListObjectsV2(std::string_view xml, std::string_view what);

// <Error><Code>..</Code><Message>..</Message></Error>; false if `xml` is not one.
bool ParseS3Error(std::string_view xml, std::string* code, std::string* message);

// The UploadId of an InitiateMultipartUpload result.
Result<std::string> ParseUploadId(std::string_view xml, std::string_view what);

// The CompleteMultipartUpload request body for parts (number, ETag), in order.
std::string CompleteMultipartXml(const std::vector<std::pair<int, std::string>>& parts);

}  // namespace ddp::store_internal
