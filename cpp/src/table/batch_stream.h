// A rank's epoch of table batches gathered ahead on the engine's own thread.
//
// The caller pushes jobs: a job is a window of segments (a GatherLayout) with the rows of
// a run of consecutive batches in it (segment and row of each position). A thread cuts
// each job into batches of `batch_size` rows (the job's last one may be shorter), gathers
// each into newly allocated output buffers and queues it, at most `prefetch` batches
// ahead of the consumer; Next() hands them out in order. Neither the jobs nor the batches
// touch the caller's interpreter: the consumer's only work per batch is one Next().
//
// Memory the caller lends (AdoptBuffers: e.g. page-locked host memory a GPU copies from
// without staging) holds a batch's outputs while one is free; a lent buffer comes back to
// the stream when the batch's last output is freed, so a batch still held (e.g. while its
// copy runs) is never gathered over. With none free, a batch gets blocks of its own.
//
// Jobs finish in the order pushed: jobs_done() counts them, so a caller keeping the
// job's buffers alive (the segments' records) releases them once their job is done.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/process.h"
#include "ddp/status.h"
#include "table/gather.h"

namespace ddp::table {

struct BatchJob {
  std::shared_ptr<const GatherLayout> layout;  // validated (ValidateLayout)
  std::vector<int32_t> segment;                // the segment of each position
  std::vector<int64_t> row;                    // the row of each position in its segment
};

// Memory lent for batches; `keep` holds whatever keeps `data` valid, dropped once no
// batch can use the memory any more.
struct LentBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<void> keep;
};

struct Batch {
  size_t rows = 0;
  // rows * output_row_bytes[o] bytes each: blocks of its own, or parts of one lent buffer
  // (the outputs share its lease).
  std::vector<std::shared_ptr<uint8_t[]>> outputs;
};

class BatchStream {
 public:
  // output_row_bytes: bytes of one row of each output (every job's layout must match);
  // prefetch >= 1 batches gathered ahead; max_jobs >= 1 jobs pushed and not finished
  // (Push blocks beyond). pool may be null (the stream's thread copies alone); it must
  // outlive the stream. ahead false: no thread; Next() gathers each batch in the calling
  // thread (for a consumer with no core to spare, where a hand-over between threads per
  // batch costs more than it overlaps).
  BatchStream(std::vector<size_t> output_row_bytes, size_t batch_size, size_t prefetch,
              size_t max_jobs, GatherPool* pool, bool ahead = true);
  ~BatchStream();
  BatchStream(const BatchStream&) = delete;
  BatchStream& operator=(const BatchStream&) = delete;

  // Queues a job; blocks while max_jobs jobs are unfinished. Errors: the job's layout
  // does not match the stream's outputs, or its index arrays differ in length
  // (InvalidArgument); the stream was closed or finished (Cancelled / FailedPrecondition).
  Status Push(BatchJob job);
  // No more jobs: Next reports the end after the last batch.
  void Finish();
  // The next batch. Blocks until one is gathered; *end is set (and *batch left empty)
  // after the last batch of a finished stream or once closed. A gather error (an index
  // out of range) is returned in order, after the batches before it, and ends the stream.
  // With timeout_s >= 0, DeadlineExceeded when nothing came within it.
  Status Next(Batch* batch, bool* end, double timeout_s = -1);
  // Stops the thread (a batch being gathered is completed, then dropped); Push and Next
  // return at once from then on. Idempotent.
  void Close();
  // In a fork()ed child of the process that made the stream, Push and Next fail with
  // kOtherProcess; Finish, Close and the destructor leave the thread to the parent
  // (common/process.h).

  uint64_t jobs_done() const;
  size_t batch_size() const { return batch_size_; }

  // Bytes of a lent buffer: every output of a full batch, each at a 64-byte boundary.
  size_t batch_buffer_bytes() const;
  // Lends the stream memory for batches (see the top). InvalidArgument naming the buffer
  // if one is null, smaller than batch_buffer_bytes() or not 8-byte aligned. After
  // Close() a lent buffer is dropped as its batch is freed.
  Status AdoptBuffers(std::vector<LentBuffer> buffers);

 private:
  struct Lent;  // the lent buffers not in use, shared with the batches' leases
  // A free lent buffer as one lease (null: none free).
  std::shared_ptr<uint8_t[]> TakeLent() const;
  void Run();
  // Next() without a thread: the next batch gathered here.
  Status NextInline(Batch* batch, bool* end, double timeout_s);
  // The batch of `rows` rows at `begin` of job, gathered into new buffers.
  Status Gather(const BatchJob& job, size_t begin, size_t rows, Batch* batch) const;
  // A job whose batches are all gathered: its buffers released, counted done (mu_ held).
  void JobDone(std::unique_lock<std::mutex>& lock, BatchJob job);
  Status CheckProcess() const;

  ProcessOwner owner_;
  const std::vector<size_t> output_row_bytes_;
  const size_t batch_size_;
  const size_t prefetch_;
  const size_t max_jobs_;
  GatherPool* const pool_;

  mutable std::mutex mu_;
  std::condition_variable changed_;  // any state change: jobs, batches, end, close
  std::deque<BatchJob> jobs_;        // pushed, not started
  size_t unfinished_ = 0;            // jobs pushed and not finished
  uint64_t done_ = 0;                // jobs finished
  std::deque<Batch> ready_;
  Status error_;                     // a gather error, after the ready batches
  bool finished_ = false;            // no more jobs
  bool worker_done_ = false;         // the thread has ended (finished, an error or closed)
  bool closed_ = false;
  const bool ahead_;
  const std::shared_ptr<Lent> lent_;
  // Without a thread: the job being cut into batches, and its next row.
  std::optional<BatchJob> current_;
  size_t cursor_ = 0;
  std::mutex join_mu_;
  std::thread worker_;
};

}  // namespace ddp::table
