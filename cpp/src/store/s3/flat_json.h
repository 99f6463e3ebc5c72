// A small, strict JSON reader for the flat objects AWS credential endpoints answer
// (ECS/EKS container credentials, EC2 instance metadata): {"AccessKeyId": "...", ...}.
//
// Only the top-level members whose values are strings, numbers, booleans or null are
// kept (numbers and booleans as their text, null as ""); nested objects and arrays are
// parsed and skipped. Error messages give the byte offset and never quote the document,
// which carries secrets.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "ddp/status.h"

namespace ddp::store_internal {

// The scalar members of the JSON object `text`. Fails (kDataLoss) on anything that is
// not one well-formed JSON object, on duplicate keys, on nesting deeper than 32 levels.
Result<std::map<std::string, std::string>> ParseFlatJsonObject(std::string_view text);

}  // namespace ddp::store_internal
