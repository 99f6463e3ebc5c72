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

void FillHeader(uint8_t* out, int64_t rows, size_t record_bytes) {
  std::memset(out, 0, kHostCacheHeaderBytes);
  std::memcpy(out, kMagic, 8);
  const auto urows = static_cast<uint64_t>(rows);
  const auto urec = static_cast<uint64_t>(record_bytes);
  std::memcpy(out + 8, &urows, 8);
  std::memcpy(out + 16, &urec, 8);
}

Status CheckSize(const std::string& path, size_t bytes, int64_t rows, size_t record_bytes) {
  if (rows < 0 || record_bytes == 0 || bytes != static_cast<size_t>(rows) * record_bytes) {
    return InvalidArgumentError(path + ": " + std::to_string(bytes) + " bytes are not " +
                                std::to_string(rows) + " records of " +
                                std::to_string(record_bytes) + " bytes");
  }
  return Status::Ok();
}

// Creates `tmp` (0600, not there before) of `size` bytes with the space reserved: on a
// full tmpfs the error is here, not a SIGBUS in a later write. The file is removed on
// an error.
Result<int> CreateReserved(const std::string& tmp, size_t size) {
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "create", tmp);
  if (int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size)); err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoError(err, "reserve " + std::to_string(size) + " bytes", tmp);
  }
  return fd;
}

// Writes `bytes` at the start of `tmp` (open as `fd`) and closes it; on an error `tmp`
// is removed and the error names what failed.
Status WriteStartAndClose(Fd& fd, const std::string& tmp, std::span<const uint8_t> bytes,
                          std::string_view what) {
  if (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd.fd, bytes.data(), bytes.size(), 0);
    if (n != static_cast<ssize_t>(bytes.size())) {
      const int err = n < 0 ? errno : EIO;  // a short write sets no errno
      ::unlink(tmp.c_str());
      return ErrnoError(err, what, tmp);
    }
  }
  if (::close(fd.release()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, "close", tmp);
  }
  return Status::Ok();
}

// Links a complete `tmp` to `path` and removes `tmp`. link, not rename: a file another
// rank committed first is kept (the same records), never replaced under the ranks that
// map it.
Status LinkInPlace(const std::string& tmp, const std::string& path) {
  if (::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, "link to " + path, tmp);
  }
  if (::unlink(tmp.c_str()) != 0) return ErrnoError(errno, "unlink", tmp);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<MappedRecords>> MappedRecords::Open(const std::string& path,
                                                           size_t record_bytes) {
  if (record_bytes == 0) return InvalidArgumentError(path + ": record size 0");
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) return ErrnoError(errno, "open", path);
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) return ErrnoError(errno, "fstat", path);
  const auto size = static_cast<size_t>(st.st_size);
  if (size < kHostCacheHeaderBytes) {
    return DataLossError(path + ": " + std::to_string(size) +
                         " bytes, shorter than the cache file header");
  }
  uint8_t header[kHostCacheHeaderBytes];
  const ssize_t got = ::pread(fd.fd, header, sizeof header, 0);
  if (got < 0) return ErrnoError(errno, "read", path);
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
  // Populated at once: one call maps every page, where the gather would fault each in.
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd.fd, 0);
  if (base == MAP_FAILED) return ErrnoError(errno, "mmap", path);
  return std::unique_ptr<MappedRecords>(new MappedRecords(
      path, static_cast<const uint8_t*>(base), size, static_cast<int64_t>(rows), rec));
}

MappedRecords::~MappedRecords() {
  // munmap fails only for an invalid range, which Open never makes.
  ::munmap(const_cast<uint8_t*>(base_), size_);
}

Status WriteRecordsFile(const std::string& path, std::span<const uint8_t> records,
                        int64_t rows, size_t record_bytes) {
  if (Status s = CheckSize(path, records.size(), rows, record_bytes); !s.ok()) return s;
  const std::string tmp = TempName(path);
  const size_t size = kHostCacheHeaderBytes + records.size();
  Result<int> created = CreateReserved(tmp, size);
  if (!created.ok()) return created.status();
  Fd fd{created.value()};
  auto fail = [&](Status s) {
    ::unlink(tmp.c_str());  // best effort: the temporary file is never left behind
    return s;
  };
  void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (base == MAP_FAILED) return fail(ErrnoError(errno, "mmap", tmp));
  auto* out = static_cast<uint8_t*>(base);
  FillHeader(out, rows, record_bytes);
  if (!records.empty()) std::memcpy(out + kHostCacheHeaderBytes, records.data(), records.size());
  if (::munmap(base, size) != 0) return fail(ErrnoError(errno, "munmap", tmp));
  if (::close(fd.release()) != 0) return fail(ErrnoError(errno, "close", tmp));
  return LinkInPlace(tmp, path);
}

Status CreateRecordsFile(const std::string& tmp, int64_t rows, size_t record_bytes,
                         std::span<const uint8_t> token) {
  if (rows < 0 || record_bytes == 0) {
    return InvalidArgumentError(tmp + ": " + std::to_string(rows) + " records of " +
                                std::to_string(record_bytes) + " bytes");
  }
  if (token.size() > kHostCacheHeaderBytes) {
    return InvalidArgumentError(tmp + ": a token of " + std::to_string(token.size()) +
                                " bytes is longer than the header");
  }
  Result<int> created =
      CreateReserved(tmp, kHostCacheHeaderBytes + static_cast<size_t>(rows) * record_bytes);
  if (!created.ok()) return created.status();
  Fd fd{created.value()};
  return WriteStartAndClose(fd, tmp, token, "write the token");
}

Status CommitRecordsFile(const std::string& tmp, const std::string& path, int64_t rows,
                         size_t record_bytes) {
  Fd fd{::open(tmp.c_str(), O_RDWR | O_CLOEXEC)};
  if (fd.fd < 0) return ErrnoError(errno, "open", tmp);
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) return ErrnoError(errno, "fstat", tmp);
  const auto size = static_cast<size_t>(st.st_size);
  if (rows < 0 || record_bytes == 0 || size < kHostCacheHeaderBytes ||
      size - kHostCacheHeaderBytes != static_cast<size_t>(rows) * record_bytes) {
    ::unlink(tmp.c_str());
    return DataLossError(tmp + ": " + std::to_string(size) + " bytes are not the header and " +
                         std::to_string(rows) + " records of " + std::to_string(record_bytes) +
                         " bytes");
  }
  uint8_t header[kHostCacheHeaderBytes];
  FillHeader(header, rows, record_bytes);
  if (Status s = WriteStartAndClose(fd, tmp, header, "write the header"); !s.ok()) return s;
  return LinkInPlace(tmp, path);
}

Result<std::unique_ptr<FileLock>> FileLock::Acquire(const std::string& path,
                                                    double timeout_s) {
  Fd fd{::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)};
  if (fd.fd < 0) return ErrnoError(errno, "open lock", path);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(timeout_s > 0 ? timeout_s : 0);
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    if (::flock(fd.fd, LOCK_EX | LOCK_NB) == 0) {
      return std::unique_ptr<FileLock>(new FileLock(fd.release()));
    }
    if (errno != EWOULDBLOCK && errno != EINTR) return ErrnoError(errno, "flock", path);
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
  if (::statvfs(dir.c_str(), &st) != 0) return ErrnoError(errno, "statvfs", dir);
  return static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
}

}  // namespace ddp::table
