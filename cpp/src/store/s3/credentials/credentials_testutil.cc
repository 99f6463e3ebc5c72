#include "store/s3/credentials/credentials_testutil.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

namespace ddp::store_internal::testing {
namespace {

[[noreturn]] void Fail(const std::string& path, const char* what) {
  std::fprintf(stderr, "TempFile %s: %s: %s\n", path.c_str(), what, std::strerror(errno));
  std::abort();
}

}  // namespace

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string TempFile(const std::string& content) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ddp-aws-XXXXXX").string();
  int fd = ::mkstemp(tmpl.data());
  if (fd < 0) Fail(tmpl, "mkstemp");
  if (::close(fd) != 0) Fail(tmpl, "close");
  std::ofstream out(tmpl);
  out << content;
  if (!out.flush()) Fail(tmpl, "write");
  return tmpl;
}

int64_t UnixSeconds(WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t.time_since_epoch()).count();
}

}  // namespace ddp::store_internal::testing
