// Small text helpers shared by the store back-ends (headers, config files, environment).
#pragma once

#include <string>
#include <string_view>

namespace ddp::store_internal {

// ASCII lower case (HTTP header names, config values such as "true").
std::string Lower(std::string_view s);

// `s` without leading and trailing whitespace (spaces, tabs, CR, LF, ...).
std::string_view Trim(std::string_view s);

}  // namespace ddp::store_internal
