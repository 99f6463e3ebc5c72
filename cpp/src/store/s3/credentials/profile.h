// Fixed keys from a named profile of the AWS shared files: the credentials file
// (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials, sections "[name]") and the config
// file (AWS_CONFIG_FILE or ~/.aws/config, sections "[profile name]" but "[default]"),
// which also give the profile's region.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/status.h"
#include "store/s3/credentials/aws_credentials.h"
#include "store/s3/credentials/environment.h"

namespace ddp::store_internal {

// The paths of the two files ("" when neither the variable nor HOME is set).
std::string SharedCredentialsFile(const EnvLookup& env);
std::string SharedConfigFile(const EnvLookup& env);

// The key/value pairs of section `section` of an INI file ("[default]",
// "[profile x]"). A missing file is an empty map; nullopt when the section is absent.
Result<std::optional<std::map<std::string, std::string>>> ReadIniSection(
    const std::string& path, const std::string& section);

// The keys of `profile`, credentials file first, source "profile 'x' in <file>"; nullopt
// when it has none. `*region` gets the profile's region if it is still empty; `*found`
// says whether either file has the profile at all.
Result<std::optional<AwsCredentials>> ProfileCredentials(const EnvLookup& env, const std::string& profile,
                                                         std::string* region, bool* found);

// The keys of `profile`, which must have them (AWS_PROFILE names it): kUnauthenticated
// otherwise, naming the profile, both files and `url` (redacted).
Result<AwsCredentials> NamedProfileCredentials(const EnvLookup& env, const std::string& profile,
                                               std::string_view url, std::string* region);

}  // namespace ddp::store_internal
