// file:// and plain paths: a directory whose files are the objects, keys are relative
// paths with '/' separators.
//
// Put is atomic for readers: the data goes to a temporary file in the target's own
// directory (same file system), is fsync'ed, then renamed over the target, and the
// directory is fsync'ed so the rename survives a crash. Temporary files carry the
// marker below and are never listed.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

#include "store/backends.h"
#include "store/key.h"

namespace ddp::store_internal {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kTempMarker = ".ddp-tmp-";

// Closes a file descriptor on scope exit unless released.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now and reports the error (a failed close can lose written data).
  int Close() {
    int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

class FileStore final : public Store {
 public:
  explicit FileStore(fs::path root) : root_(std::move(root)) {}

  std::string url() const override { return "file://" + root_.string(); }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    // Walk only the deepest directory the prefix names, then filter by the full prefix.
    size_t last_slash = prefix.rfind('/');
    std::string_view dir_part =
        last_slash == std::string_view::npos ? std::string_view() : prefix.substr(0, last_slash);
    if (!dir_part.empty()) {
      // The prefix's folders become a path: they must stay inside the root.
      DDP_RETURN_IF_ERROR(ValidateKey(dir_part, url(), /*strict=*/true)
                              .WithContext("invalid list prefix '" + std::string(prefix) + "'"));
    } else if (last_slash != std::string_view::npos) {
      return InvalidArgumentError(url() + ": invalid list prefix '" + std::string(prefix) +
                                  "' (starts with '/'; keys are relative to the store root)");
    }
    fs::path start = dir_part.empty() ? root_ : root_ / std::string(dir_part);
    std::error_code ec;
    if (!fs::is_directory(start, ec)) return out;  // nothing there: an empty listing, as S3
    fs::recursive_directory_iterator it(start, fs::directory_options::skip_permission_denied, ec);
    if (ec) return ErrnoError(ec.value(), "listing directory", start.string());
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) return ErrnoError(ec.value(), "listing directory", start.string());
      const fs::directory_entry& e = *it;
      std::string name = e.path().filename().string();
      if (name.find(kTempMarker) != std::string::npos) continue;
      std::error_code ec2;
      if (!e.is_regular_file(ec2)) continue;
      std::string key = e.path().lexically_relative(root_).generic_string();
      if (!std::string_view(key).starts_with(prefix)) continue;
      uint64_t size = e.file_size(ec2);
      if (ec2) continue;  // vanished between listing and stat: not there
      out.push_back({std::move(key), size});
    }
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  Result<ObjectInfo> Stat(std::string_view key) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url(), /*strict=*/true));
    std::string path = PathOf(key);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return ErrnoError(errno, "stat", path);
    if (!S_ISREG(st.st_mode)) return NotFoundError(path + ": not a regular file");
    return ObjectInfo{std::string(key), static_cast<uint64_t>(st.st_size)};
  }

  Result<std::string> Get(std::string_view key, ByteRange range) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url(), /*strict=*/true));
    std::string path = PathOf(key);
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return ErrnoError(errno, "open", path);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "fstat", path);
    if (!S_ISREG(st.st_mode)) return NotFoundError(path + ": not a regular file");
    DDP_ASSIGN_OR_RETURN(ResolvedRange r,
                         ResolveRange(range, static_cast<uint64_t>(st.st_size), path));
    std::string data(r.length, '\0');
    uint64_t done = 0;
    while (done < r.length) {
      ssize_t n = ::pread(fd.get(), data.data() + done, r.length - done,
                          static_cast<off_t>(r.offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, "read", path);
      }
      if (n == 0) {
        return DataLossError(path + ": file shrank while reading: got " + std::to_string(done) +
                             " of " + std::to_string(r.length) + " bytes");
      }
      done += static_cast<uint64_t>(n);
    }
    return data;
  }

  Status Put(std::string_view key, std::string_view data) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url(), /*strict=*/true));
    fs::path target = root_ / std::string(key);
    fs::path dir = target.parent_path();
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return ErrnoError(ec.value(), "creating directory", dir.string());
    std::string tmpl = (dir / ("." + target.filename().string())).string();
    tmpl += kTempMarker;
    tmpl += "XXXXXX";
    int raw = ::mkostemp(tmpl.data(), O_CLOEXEC);
    if (raw < 0) return ErrnoError(errno, "creating temporary file", tmpl);
    Fd fd(raw);
    Status st = WriteAll(fd.get(), data, tmpl);
    // mkstemp creates 0600; objects are ordinary files.
    if (st.ok() && ::fchmod(fd.get(), 0644) != 0) st = ErrnoError(errno, "chmod", tmpl);
    if (st.ok() && ::fsync(fd.get()) != 0) st = ErrnoError(errno, "fsync", tmpl);
    if (st.ok() && fd.Close() != 0) st = ErrnoError(errno, "close", tmpl);
    if (st.ok() && ::rename(tmpl.c_str(), target.c_str()) != 0) {
      st = ErrnoError(errno, "renaming temporary file into place", target.string());
    }
    if (!st.ok()) {
      ::unlink(tmpl.c_str());  // best effort: the error already reported matters more
      return st;
    }
    return SyncDir(dir);
  }

  Status Delete(std::string_view key) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url(), /*strict=*/true));
    std::string path = PathOf(key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError(errno, "unlink", path);
    return Status::Ok();
  }

 private:
  std::string PathOf(std::string_view key) const { return (root_ / std::string(key)).string(); }

  static Status WriteAll(int fd, std::string_view data, const std::string& path) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError(errno, "write", path);
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  static Status SyncDir(const fs::path& dir) {
    Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0) return ErrnoError(errno, "opening directory to fsync", dir.string());
    if (::fsync(fd.get()) != 0) return ErrnoError(errno, "fsync directory", dir.string());
    return Status::Ok();
  }

  fs::path root_;
};

}  // namespace

Result<std::unique_ptr<Store>> OpenFileStore(std::string_view path, const StoreOptions& options) {
  if (path.empty()) return InvalidArgumentError("empty path for a file store");
  if (path.find('\0') != std::string_view::npos) {
    return InvalidArgumentError("file store path contains a NUL byte");
  }
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(std::string(path)), ec);
  if (ec) return ErrnoError(ec.value(), "resolving path", path);
  p = p.lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  struct stat st;
  if (::stat(s.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError("file store root '" + s + "' exists and is not a directory");
  }
  return std::unique_ptr<Store>(new FileStore(fs::path(s)));
}

}  // namespace ddp::store_internal
