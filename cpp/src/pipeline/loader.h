// The batch loader: a thread pool that fetches images from a Store, decodes and transforms
// them straight into reused batch buffers, and delivers batches in order with at most
// `prefetch` batches in flight.
//
// Buffer lifetime: a delivered Batch owns its buffer (a lease). The buffer returns to the
// loader's free list only when the lease is destroyed (for Python: when torch frees the
// tensor), so a batch the caller keeps is never overwritten; if the caller keeps many, the
// loader allocates new buffers rather than wait. The free list holds at most `prefetch`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "ddp/status.h"
#include "ddp/store.h"
#include "image/decode.h"
#include "image/transforms.h"
#include "pipeline/sample_source.h"
#include "pipeline/sampler.h"

namespace ddp::pipeline {

struct LoaderOptions {
  int batch_size = 64;
  int num_threads = 0;       // 0: std::thread::hardware_concurrency()
  int prefetch = 4;          // batch buffers in use: in flight plus held by the caller
  bool drop_last = false;    // drop the last incomplete batch (and the sampler's uneven tail)
  bool skip_errors = false;  // on_error="skip": leave bad images out and count them
                             // (data errors only; storage errors still fail)
  bool skip_missing = false; // with skip_errors, also skip objects that do not exist
                             // (a manifest naming removed files); other storage errors fail
  bool scaled_decode = true; // allow libjpeg-turbo DCT-scaled decode for large crops
  bool region_decode = true; // decode only the rows/columns a crop-first pipeline reads
  bool batched_fetch = true; // Store::GetMany on a fetch thread; false: Get per sample
  int max_in_flight = 0;     // GetMany requests in flight (0: the store's option)
  // Each decode thread reuses one pixel buffer; one grown past this many bytes (by a
  // large image) is freed after its sample instead of kept for the Loader's life.
  size_t decode_buffer_keep_bytes = 16u << 20;
  SamplerOptions sampler;
  image::DecodeOptions decode;
  // A SampleSource's samples: false when they carry no image (only fields).
  bool decode_images = true;
  // The names of a SampleSource's fields (SourceSample::fields), for messages.
  std::vector<std::string> field_names;
};

class BufferPool;

// Memory the caller lends the loader for batch images, e.g. page-locked host memory a GPU
// copies from without staging (the loader links no CUDA: Python allocates it). `keep`
// holds whatever keeps `data` valid; the loader drops it only when no batch can use the
// memory any more (its pool is gone: the loader and every batch leased from it).
struct ExternalBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<void> keep;
};

// One batch buffer: images (3 x H x W per sample, float32 or uint8), then int64 labels
// at `label_offset` (a multiple of 64), in one block: the pool's own memory or a buffer
// the caller lent, so page-locked memory holds the labels too and both copy without
// staging.
struct BatchBuffer {
  std::vector<uint8_t> owned;
  ExternalBuffer external;
  size_t label_offset = 0;
  uint8_t* images() { return external.data != nullptr ? external.data : owned.data(); }
  int64_t* labels() { return reinterpret_cast<int64_t*>(images() + label_offset); }
};

// Owns a buffer while the caller uses it; returns it to the pool when destroyed.
class BufferLease {
 public:
  BufferLease(std::shared_ptr<BufferPool> pool, std::unique_ptr<BatchBuffer> buf);
  ~BufferLease();
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  BatchBuffer& buffer() { return *buf_; }

 private:
  std::shared_ptr<BufferPool> pool_;
  std::unique_ptr<BatchBuffer> buf_;
};

// One field of a SampleSource's samples over a batch.
struct FieldColumn {
  FieldKind kind = FieldKind::kBytes;
  std::vector<int64_t> ints;                   // kInt: one per sample
  char dtype_kind = 'f';                       // kArray: the arrays' dtype and shape
  int itemsize = 0;
  std::vector<int64_t> shape;                  // of one sample's array
  std::shared_ptr<std::vector<uint8_t>> data;  // kArray: size x shape, C order
  std::vector<std::string> raw;                // kBytes: one per sample
};

struct Batch {
  std::shared_ptr<BufferLease> lease;
  void* images = nullptr;   // size x 3 x H x W, contiguous
  int64_t* labels = nullptr;
  int64_t size = 0;         // samples in this batch (fewer when last or when skipping)
  int64_t index = 0;        // batch number within the epoch
  int64_t skipped = 0;      // samples of this batch left out (on_error="skip")
  std::vector<FieldColumn> fields;  // a SampleSource's fields, in order
};

class Loader {
 public:
  // `keys` are relative to `store`; labels[i] belongs to keys[i].
  static Result<std::unique_ptr<Loader>> Create(std::shared_ptr<Store> store, std::vector<std::string> keys,
                                                std::vector<int64_t> labels, image::Pipeline pipeline,
                                                const LoaderOptions& options);
  // Samples from `source` (e.g. tar shards), which decides the order; options.sampler's
  // shuffle, rank and world size are the source's business, its seed still draws each
  // sample's augmentation. Fetching is always batched (one fetch thread).
  static Result<std::unique_ptr<Loader>> Create(std::shared_ptr<SampleSource> source, image::Pipeline pipeline,
                                                const LoaderOptions& options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const image::Pipeline& pipeline() const { return pipeline_; }
  int64_t num_samples() const { return source_ ? source_->NumSamples(source_epoch_.load()) : key_samples_.load(); }
  int64_t num_batches() const;
  // Samples skipped since the loader was made (on_error="skip").
  int64_t skipped() const { return skipped_.load() + (source_ ? source_->skipped() : 0); }
  // Bytes of decode buffers the worker threads keep between samples (each at most
  // options.decode_buffer_keep_bytes).
  int64_t decode_buffer_bytes() const { return decode_buffer_bytes_.load(); }

  // Starts (or restarts) iteration over `epoch` at batch `start_batch`; cancels work
  // in flight for the previous epoch. In a fork()ed child of the process that made the
  // loader, StartEpoch and Next fail with kOtherProcess; Shutdown and the destructor free
  // nothing of the parent's there (common/process.h); the counts above still answer.
  Status StartEpoch(uint64_t epoch, int64_t start_batch = 0);
  // The next batch in order; nullopt at the end of the epoch. Blocks. One consumer at a
  // time (the Python side serialises calls); a concurrent StartEpoch makes it kCancelled,
  // a concurrent Shutdown kFailedPrecondition ("closed").
  Result<std::optional<Batch>> Next();

  // Replaces the keys of a loader made over a Store (labels[i] belongs to keys[i]),
  // keeping its threads, batch buffers (lent ones too), store and options: a caller that
  // reads many short lists with one pipeline (predict's partitions) builds one loader.
  // Cancels work in flight as StartEpoch does; Next() then returns the end until the next
  // StartEpoch, which reads the new list (the sampler's options as made, over its size).
  // Safe while the caller holds batches of the previous list: they own their buffers and
  // stay as delivered (they count against `prefetch` until released, as always). A
  // concurrent Next() fails with kCancelled. FailedPrecondition for a loader over a
  // SampleSource (its samples are the source's) or a closed one; InvalidArgument when
  // the counts of keys and labels differ.
  Status Restart(std::vector<std::string> keys, std::vector<int64_t> labels);

  // Bytes of one batch's buffer (its images, then its labels at a 64-byte boundary): what
  // each lent buffer must hold at least.
  size_t batch_buffer_bytes() const;
  // Lends the loader memory for batches, images and labels (see ExternalBuffer): the
  // buffers are used before the loader allocates its own, and kept (never freed for a
  // smaller pool) for the loader's life. InvalidArgument naming the buffer if one is too
  // small, null or not 8-byte aligned.
  Status AdoptBuffers(std::vector<ExternalBuffer> buffers);

  // Stops the threads and wakes every waiter (Next, StartEpoch then fail as closed).
  // Safe from any thread, at any time, any number of times; the destructor calls it.
  // Batches already delivered stay valid (their buffers belong to their leases).
  void Shutdown();

 private:
  struct BatchState;
  struct Task;
  Loader(std::shared_ptr<Store> store, std::vector<std::string> keys, std::vector<int64_t> labels,
         image::Pipeline pipeline, const LoaderOptions& options, DistributedSampler sampler);
  void ScheduleLocked();
  void WorkerLoop();
  void FetchLoop();
  void FetchFromSource(const std::vector<std::shared_ptr<BatchState>>& batches);
  // A fetched sample (or its failure) for slot `slot` of batch `b`: queued for decoding.
  void Fetched(const std::shared_ptr<BatchState>& b, size_t slot, Status st, std::string bytes, std::string url);
  // A batch's fields over its slots `kept` (arrays stacked: their shapes must match).
  Result<std::vector<FieldColumn>> StackFields(BatchState& b, const std::vector<size_t>& kept) const;
  int64_t BatchesOf(int64_t samples) const;
  void RunTask(Task& t, image::Image& img);
  void FinishSample(BatchState& b, size_t slot, Status st);
  void CancelLocked(std::unique_lock<std::mutex>& lock);
  bool Skippable(const Status& s) const;  // on_error="skip" leaves this sample out
  Status CheckProcess() const;             // kOtherProcess in a fork()ed child

  ProcessOwner owner_;

  std::shared_ptr<Store> store_;
  std::vector<std::string> keys_;
  std::vector<int64_t> labels_;
  image::Pipeline pipeline_;
  LoaderOptions opt_;
  DistributedSampler sampler_;
  std::shared_ptr<BufferPool> pool_;
  std::shared_ptr<SampleSource> source_;  // set: samples come from it, not from keys_
  std::atomic<uint64_t> source_epoch_{0};  // epoch_, readable without mu_ (num_samples)
  std::atomic<int64_t> key_samples_{0};    // sampler_.num_samples(), readable without mu_

  std::mutex mu_;
  std::condition_variable work_cv_;   // workers wait here for tasks
  std::condition_variable fetch_cv_;  // the fetch thread waits here for batches
  std::condition_variable done_cv_;   // Next() and cancellation wait here
  bool stop_ = false;
  uint64_t generation_ = 0;
  uint64_t epoch_ = 0;
  std::vector<int64_t> order_;        // this rank's indices for the epoch
  int64_t next_schedule_ = 0;
  int64_t next_deliver_ = 0;
  int64_t end_batch_ = 0;
  std::map<int64_t, std::shared_ptr<BatchState>> inflight_;
  std::deque<Task> tasks_;
  std::deque<std::shared_ptr<BatchState>> fetch_queue_;
  int busy_ = 0;                      // tasks running plus fetch calls running
  std::atomic<bool> fetch_cancel_{false};  // aborts a running GetMany on restart/destroy
  std::atomic<int64_t> skipped_{0};
  std::atomic<int64_t> decode_buffer_bytes_{0};
  std::vector<std::thread> threads_;
  std::mutex shutdown_mu_;  // serialises Shutdown's joins
};

}  // namespace ddp::pipeline
