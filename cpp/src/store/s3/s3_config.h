// Where an s3:// store sends its requests and how it signs them, resolved from the URL,
// StoreOptions and the AWS conventions (environment variables and the shared files).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/store.h"

namespace ddp::store_internal {

struct S3Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty unless temporary credentials
  std::string source;         // where they came from, for messages ("environment", ...)
};

struct S3Config {
  std::string bucket;
  std::string prefix;     // root prefix within the bucket, no leading or trailing '/'
  std::string endpoint;   // scheme://host[:port], no trailing '/'
  bool path_style = true; // https://host/bucket/key rather than https://bucket.host/key
  std::string region;
  std::optional<S3Credentials> credentials;  // nullopt: anonymous, unsigned requests

  // The URL of the bucket (no trailing '/'); object URLs append "/" + encoded key.
  std::string BucketUrl() const;
};

// Reads an environment variable; tests inject their own.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
EnvLookup ProcessEnv();

// Resolves everything for `url` ("s3://bucket[/prefix]"). Precedence:
//  endpoint: options.endpoint_url, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS
//            (virtual-hosted style, or path style for bucket names with dots);
//  region:   options.region, AWS_REGION, AWS_DEFAULT_REGION, the profile's region in
//            the config file, else us-east-1;
//  credentials (unless options.anonymous): the profile named by AWS_PROFILE if set,
//            else AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY(/AWS_SESSION_TOKEN), else
//            the "default" profile; a profile is read from the shared credentials file
//            (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials), then from the config
//            file (AWS_CONFIG_FILE or ~/.aws/config). None found is kUnauthenticated.
Result<S3Config> ResolveS3Config(std::string_view url, const StoreOptions& options,
                                 const EnvLookup& env);

// The key/value pairs of section `section` of an INI file ("[default]",
// "[profile x]"). A missing file is an empty map; nullopt when the section is absent.
Result<std::optional<std::map<std::string, std::string>>> ReadIniSection(
    const std::string& path, const std::string& section);

}  // namespace ddp::store_internal
