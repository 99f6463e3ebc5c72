// One cache of a table's partitions per host: a partition's records (table/pack.h's
// layout) in a file of a memory file system (/dev/shm), written once by the first local
// rank that needs it and mapped read-only by every rank of the host.
//
// A file is a 64-byte header (magic, version, rows, record bytes) then the records. It is
// written under a temporary name beside its own and linked to its name when complete, so
// a reader sees a whole file or none; a second writer of the same partition keeps the
// first one's file. Space is reserved when the file is made (posix_fallocate), so a full
// file system is an error here, not a SIGBUS on a later write.
//
// Which rank writes is decided by an advisory lock (flock) per partition, which the
// kernel releases when its holder dies: a rank killed while fetching never blocks the
// others beyond their own bound.
//
// Every error names the file it concerns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ddp/status.h"

namespace ddp::table {

inline constexpr size_t kHostCacheHeaderBytes = 64;

// A committed partition file mapped read-only.
class MappedRecords {
 public:
  // Maps `path`, checking its header and size against `record_bytes`. NotFound when the
  // file does not exist (not written yet); DataLoss when its header or size is wrong.
  static Result<std::unique_ptr<MappedRecords>> Open(const std::string& path,
                                                      size_t record_bytes);
  ~MappedRecords();
  MappedRecords(const MappedRecords&) = delete;
  MappedRecords& operator=(const MappedRecords&) = delete;

  const uint8_t* records() const { return base_ + kHostCacheHeaderBytes; }
  int64_t rows() const { return rows_; }
  size_t record_bytes() const { return record_bytes_; }
  const std::string& path() const { return path_; }

 private:
  MappedRecords(std::string path, const uint8_t* base, size_t size, int64_t rows,
                size_t record_bytes)
      : path_(std::move(path)), base_(base), size_(size), rows_(rows),
        record_bytes_(record_bytes) {}

  std::string path_;
  const uint8_t* base_;
  size_t size_;
  int64_t rows_;
  size_t record_bytes_;
};

// Writes `rows` records of `record_bytes` each (records.size() == rows * record_bytes) as
// the partition file `path` (mode 0600): a temporary file beside it, space reserved,
// filled, then linked to `path`. When `path` exists already (another rank wrote it), that
// file is kept and the call succeeds. Errors: ResourceExhausted when the file system has
// no room (the temporary file is removed), another code for other failures; each names
// the file.
Status WriteRecordsFile(const std::string& path, std::span<const uint8_t> records,
                        int64_t rows, size_t record_bytes);

// Creates the temporary file `tmp` (mode 0600; an error if it exists) of a partition's
// `rows` records of `record_bytes`, for another process of the host to write the records
// into (after the header): space reserved, and `token` (at most the header's size) where
// the header goes, for the writer to check it has the right file. CommitRecordsFile then
// makes it the partition file. Removed on an error, which names it (ResourceExhausted
// when the file system has no room).
Status CreateRecordsFile(const std::string& tmp, int64_t rows, size_t record_bytes,
                         std::span<const uint8_t> token);

// Writes the header of `tmp` (made by CreateRecordsFile, its records written) and links
// it to `path` as WriteRecordsFile does (a file already there is kept); `tmp` is removed
// in every case. DataLoss or InvalidArgument when its size is not `rows` records.
Status CommitRecordsFile(const std::string& tmp, const std::string& path, int64_t rows,
                         size_t record_bytes);

// An exclusive advisory lock on `path` (created 0600 if missing), held until destroyed
// or until the holding process ends.
class FileLock {
 public:
  // Takes the lock, waiting at most timeout_s seconds (0: one try). DeadlineExceeded
  // when another process held it throughout; other codes name the file.
  static Result<std::unique_ptr<FileLock>> Acquire(const std::string& path,
                                                   double timeout_s);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_;
};

// Bytes that files may still take in the file system holding `dir` (statvfs).
Result<uint64_t> FreeBytes(const std::string& dir);

}  // namespace ddp::table
