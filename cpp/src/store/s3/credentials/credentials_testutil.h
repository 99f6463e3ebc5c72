// Test helpers of the credential sources: an environment of given variables, files
// holding given text (shared credentials and config files, token files), and expiry
// times as Unix seconds.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "store/s3/credentials/aws_credentials.h"
#include "store/s3/credentials/environment.h"

namespace ddp::store_internal::testing {

// An EnvLookup that sees only `vars`.
EnvLookup FakeEnv(std::map<std::string, std::string> vars);

// A new file in the temporary directory holding `content`; its path. The caller removes it.
std::string TempFile(const std::string& content);

// Seconds since 1970-01-01T00:00:00Z.
int64_t UnixSeconds(WallClock::time_point t);

}  // namespace ddp::store_internal::testing
