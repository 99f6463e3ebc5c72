// Shuffled gather of table rows: rows picked from column buffers of several segments
// (a segment is the rows of one partition a rank holds) are copied into batch buffers.
//
// A segment holds its rows as records of fixed size (row-major: a row's columns side by
// side, so a picked row is one or two cache lines, not one miss per column). A column is
// `row_bytes` at `src_offset` inside each record (a scalar column: its item size; a
// fixed-length list column: width * item size; adjacent columns copied together: their
// sum). Each column goes to one output at a byte offset inside the output's row, so
// several columns can be stacked side by side into one output (the features matrix of
// an (x, y) batch).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "ddp/status.h"

namespace ddp::table {

struct GatherColumn {
  std::string name;
  size_t row_bytes = 0;                  // bytes of the column in one row
  size_t src_stride = 0;                 // bytes of one record in every segment
  size_t src_offset = 0;                 // byte offset of the column inside a record
  size_t output = 0;                     // index of the output this column fills
  size_t offset = 0;                     // byte offset of the column inside the output row
  std::vector<const uint8_t*> segments;  // the records of each segment
};

struct GatherLayout {
  std::vector<std::string> segment_names;  // e.g. "partition 3", for error messages
  std::vector<int64_t> segment_rows;       // rows held by each segment
  std::vector<GatherColumn> columns;
  std::vector<size_t> output_row_bytes;    // bytes of one row of each output
};

// Checks that every column has a buffer for every segment and fits inside its record
// and its output row, and that the outputs' rows are fully covered; the error names the
// column.
Status ValidateLayout(const GatherLayout& layout);

// A fixed set of threads running a parallel loop; the calling thread takes part. In a
// fork()ed child of the process that made it, CheckProcess fails (kOtherProcess) and the
// destructor leaves the threads to the parent (common/process.h).
class GatherPool {
 public:
  explicit GatherPool(int threads);
  ~GatherPool();
  GatherPool(const GatherPool&) = delete;
  GatherPool& operator=(const GatherPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Runs fn(0) ... fn(n - 1) on the pool's threads and returns when all have run. Only
  // in the process that made the pool (CheckProcess).
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);
  Status CheckProcess() const;

 private:
  void Work();
  bool RunOne(std::unique_lock<std::mutex>& lock);

  ProcessOwner owner_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t next_ = 0;
  size_t end_ = 0;
  size_t running_ = 0;
  bool stop_ = false;
};

// Copies row row[i] of segment segment[i] of every column into row i of its output, for
// i in [0, n). outputs[o] must hold n * layout.output_row_bytes[o] bytes. Checks every
// index first (the error names the batch position, the segment and its row count) and
// copies nothing when one is out of range. pool may be null (the calling thread copies);
// a pool made in another process (a fork()'s parent) is kOtherProcess.
Status GatherRows(const GatherLayout& layout, std::span<const int32_t> segment,
                  std::span<const int64_t> row, std::span<uint8_t* const> outputs,
                  GatherPool* pool);

}  // namespace ddp::table
