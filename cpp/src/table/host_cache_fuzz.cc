// libFuzzer target: arbitrary bytes as a host cache file, opened as a partition's
// records. Errors are expected; a crash, sanitizer report or timeout is a bug, and so is
// an accepted file whose rows and record size do not account for its size exactly.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "table/host_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the record size the reader expects (1..256); the rest is the file.
  const size_t record_bytes = static_cast<size_t>(data[0]) + 1;
  const int fd = ::memfd_create("host-cache-fuzz", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  size_t off = 1;
  while (off < size) {
    const ssize_t n = ::write(fd, data + off, size - off);
    if (n <= 0) std::abort();
    off += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto r = ddp::table::MappedRecords::Open(path, record_bytes);
  if (r.ok()) {
    const auto& m = *r.value();
    if (m.rows() < 0 || m.record_bytes() != record_bytes ||
        ddp::table::kHostCacheHeaderBytes + static_cast<size_t>(m.rows()) * record_bytes != size - 1) {
      std::abort();
    }
    if (m.rows() > 0) {  // the last record's last byte is inside the mapping
      volatile uint8_t last = m.records()[static_cast<size_t>(m.rows()) * record_bytes - 1];
      (void)last;
    }
  }
  if (::close(fd) != 0) std::abort();
  return 0;
}
