#include "table/host_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace ddp::table {
namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'T', 'R', 'E', 'C', '1'};

Status Errno(int err, std::string_view what, const std::string& path) {
  std::string m = path + ": " + std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case ENOENT: return NotFoundError(std::move(m));
    case EACCES:
    case EPERM: return PermissionDeniedError(std::move(m));
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EFBIG: return ResourceExhaustedError(std::move(m));
    default: return InternalError(std::move(m));
  }
}

// Closes a descriptor on scope exit (an error from close is reported where it matters:
// after writes, WriteRecordsFile checks it itself).
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
};

std::string TempName(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

}  // namespace

Result<std::unique_ptr<MappedRecords>> MappedRecords::Open(const std::string& path,
                                                           size_t record_bytes) {
  if (record_bytes == 0) return InvalidArgumentError(path + ": record size 0");
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) return Errno(errno, "open", path);
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) return Errno(errno, "fstat", path);
  const auto size = static_cast<size_t>(st.st_size);
  if (size < kHostCacheHeaderBytes) {
    return DataLossError(path + ": " + std::to_string(size) +
                         " bytes, shorter than the cache file header");
  }
  uint8_t header[kHostCacheHeaderBytes];
  const ssize_t got = ::pread(fd.fd, header, sizeof header, 0);
  if (got < 0) return Errno(errno, "read", path);
  if (static_cast<size_t>(got) != sizeof header || std::memcmp(header, kMagic, 8) != 0) {
    return DataLossError(path + ": not a table cache file (bad magic)");
  }
  uint64_t rows = 0, rec = 0;
  std::memcpy(&rows, header + 8, 8);
  std::memcpy(&rec, header + 16, 8);
  if (rec != record_bytes) {
    return DataLossError(path + ": records of " + std::to_string(rec) + " bytes, expected " +
                         std::to_string(record_bytes));
  }
  if (rows > (size - kHostCacheHeaderBytes) / record_bytes ||
      kHostCacheHeaderBytes + rows * record_bytes != size) {
    return DataLossError(path + ": " + std::to_string(size) + " bytes do not hold " +
                         std::to_string(rows) + " records of " + std::to_string(rec) +
                         " bytes after the header");
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.fd, 0);
  if (base == MAP_FAILED) return Errno(errno, "mmap", path);
  return std::unique_ptr<MappedRecords>(new MappedRecords(
      path, static_cast<const uint8_t*>(base), size, static_cast<int64_t>(rows), rec));
}

MappedRecords::~MappedRecords() {
  // munmap fails only for an invalid range, which Open never makes.
  ::munmap(const_cast<uint8_t*>(base_), size_);
}

Status WriteRecordsFile(const std::string& path, std::span<const uint8_t> records,
                        int64_t rows, size_t record_bytes) {
  if (rows < 0 || record_bytes == 0 ||
      records.size() != static_cast<size_t>(rows) * record_bytes) {
    return InvalidArgumentError(path + ": " + std::to_string(records.size()) +
                                " bytes are not " + std::to_string(rows) + " records of " +
                                std::to_string(record_bytes) + " bytes");
  }
  const std::string tmp = TempName(path);
  Fd fd{::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
  if (fd.fd < 0) return Errno(errno, "create", tmp);
  const size_t size = kHostCacheHeaderBytes + records.size();
  auto fail = [&](Status s) {
    ::unlink(tmp.c_str());  // best effort: the temporary file is never left behind
    return s;
  };
  // Reserves the pages: on a full tmpfs the error is here, not a SIGBUS in the copy.
  if (int err = ::posix_fallocate(fd.fd, 0, static_cast<off_t>(size)); err != 0) {
    return fail(Errno(err, "reserve " + std::to_string(size) + " bytes", tmp));
  }
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (base == MAP_FAILED) return fail(Errno(errno, "mmap", tmp));
  auto* out = static_cast<uint8_t*>(base);
  std::memset(out, 0, kHostCacheHeaderBytes);
  std::memcpy(out, kMagic, 8);
  const auto urows = static_cast<uint64_t>(rows);
  const auto urec = static_cast<uint64_t>(record_bytes);
  std::memcpy(out + 8, &urows, 8);
  std::memcpy(out + 16, &urec, 8);
  if (!records.empty()) std::memcpy(out + kHostCacheHeaderBytes, records.data(), records.size());
  if (::munmap(base, size) != 0) return fail(Errno(errno, "munmap", tmp));
  if (::close(fd.release()) != 0) return fail(Errno(errno, "close", tmp));
  // link, not rename: a file another rank committed first is kept (the same records),
  // never replaced under the ranks that map it.
  if (::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    return fail(Errno(errno, "link to " + path, tmp));
  }
  if (::unlink(tmp.c_str()) != 0) return Errno(errno, "unlink", tmp);
  return Status::Ok();
}

Result<std::unique_ptr<FileLock>> FileLock::Acquire(const std::string& path,
                                                    double timeout_s) {
  Fd fd{::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)};
  if (fd.fd < 0) return Errno(errno, "open lock", path);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0);
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (::flock(fd.fd, LOCK_EX | LOCK_NB) == 0) {
      return std::unique_ptr<FileLock>(new FileLock(fd.release()));
    }
    if (errno != EWOULDBLOCK && errno != EINTR) return Errno(errno, "flock", path);
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceededError(path + ": held by another process for " +
                                   std::to_string(timeout_s) + " s");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

FileLock::~FileLock() {
  // Closing the descriptor releases the lock; nothing to report to anyone here.
  ::close(fd_);
}

Result<uint64_t> FreeBytes(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0) return Errno(errno, "statvfs", dir);
  return static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
}

}  // namespace ddp::table
