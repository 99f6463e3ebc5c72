// Where an s3:// store sends its requests and how it signs them, resolved from the URL,
// StoreOptions and the AWS conventions (environment variables and the shared files).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ddp/store.h"
#include "store/s3/credentials/chain.h"
#include "store/s3/credentials/environment.h"

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

// Resolves everything for `url` ("s3://bucket[/prefix]"). Precedence:
//  endpoint: options.endpoint_url, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else AWS
//            (virtual-hosted style, or path style for bucket names with dots);
//  region:   options.region, AWS_REGION, AWS_DEFAULT_REGION, the profile's region in
//            the config file, else us-east-1;
//  credentials (unless options.anonymous): the chain of credentials/chain.h, fixed
//            keys or else a credential_source fetched by the store. None is
//            kUnauthenticated (only when AWS_EC2_METADATA_DISABLED=true, since
//            instance metadata is otherwise the last resort). No network here.
Result<S3Config> ResolveS3Config(std::string_view url, const StoreOptions& options,
                                 const EnvLookup& env);

}  // namespace ddp::store_internal
