// Where an s3:// store sends its requests and how it signs them, resolved from the URL,
// StoreOptions and the AWS conventions (environment variables and the shared files).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/store.h"
#include "store/s3/credential_sources.h"

namespace ddp::store_internal {

using S3Credentials = AwsCredentials;

struct S3Config {
  std::string bucket;
  std::string prefix;     // root prefix within the bucket, no leading or trailing '/'
  std::string endpoint;   // scheme://host[:port], no trailing '/'
  bool path_style = true; // https://host/bucket/key rather than https://bucket.host/key
  std::string region;
  // Fixed keys (environment, shared files), or else where temporary keys are fetched
  // from; neither: anonymous, unsigned requests.
  std::optional<S3Credentials> credentials;
  std::optional<CredentialSource> credential_source;

  // The URL of the bucket (no trailing '/'); object URLs append "/" + encoded key.
  std::string BucketUrl() const;
};

EnvLookup ProcessEnv();

// Resolves everything for `url` ("s3://bucket[/prefix]"). Precedence:
//  endpoint: options.endpoint_url, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS
//            (virtual-hosted style, or path style for bucket names with dots);
//  region:   options.region, AWS_REGION, AWS_DEFAULT_REGION, the profile's region in
//            the config file, else us-east-1;
//  credentials (unless options.anonymous), the first of:
//            1. the profile named by AWS_PROFILE, if set;
//            2. AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY(/AWS_SESSION_TOKEN);
//            3. the "default" profile; a profile is read from the shared credentials
//               file (AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials), then from the
//               config file (AWS_CONFIG_FILE or ~/.aws/config);
//            4. web identity, 5. container credentials, 6. EC2 instance metadata: a
//               credential_source (see credential_sources.h), fetched by the store.
//            None is kUnauthenticated (only when AWS_EC2_METADATA_DISABLED=true, since
//            instance metadata is otherwise the last resort). No network here.
Result<S3Config> ResolveS3Config(std::string_view url, const StoreOptions& options,
                                 const EnvLookup& env);

// kUnauthenticated: nothing in the chain gave credentials for `url`; lists what to set.
// `why` (may be empty) says why the last resort, instance metadata, failed.
Status NoCredentialsError(std::string_view url, const EnvLookup& env, std::string_view why);

// The key/value pairs of section `section` of an INI file ("[default]",
// "[profile x]"). A missing file is an empty map; nullopt when the section is absent.
Result<std::optional<std::map<std::string, std::string>>> ReadIniSection(
    const std::string& path, const std::string& section);

}  // namespace ddp::store_internal
