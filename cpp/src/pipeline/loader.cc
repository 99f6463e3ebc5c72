#include "pipeline/loader.h"

#include <algorithm>
#include <cstring>

#include "image/rng.h"

namespace ddp::pipeline {

namespace {

// What on_error="skip" skips: bad image data (corrupt, truncated, empty, not an image,
// over the size limit). Storage failures (missing object, denied, unreachable) still
// raise: they point at a broken dataset or setup, not at one bad file.
bool IsBadImage(const Status& s) {
  return s.code() == Code::kDataLoss || s.code() == Code::kInvalidArgument ||
         s.code() == Code::kResourceExhausted;
}

// The store of a Loader whose samples come from a SampleSource: never read.
class NoStore : public Store {
 public:
  std::string url() const override { return "source://"; }
  Result<std::vector<ObjectInfo>> List(std::string_view) override { return Unsupported(); }
  Result<ObjectInfo> Stat(std::string_view) override { return Unsupported(); }
  Result<std::string> Get(std::string_view, ByteRange) override { return Unsupported(); }
  Status Put(std::string_view, std::string_view) override { return Unsupported(); }
  Status Delete(std::string_view) override { return Unsupported(); }

 private:
  static Status Unsupported() { return InternalError("a sample source's loader reads no store"); }
};

}  // namespace

// ---- buffers ------------------------------------------------------------------------

class BufferPool {
 public:
  BufferPool(size_t image_bytes, size_t batch_size, size_t max_free)
      : label_offset_((image_bytes + 63) / 64 * 64),
        buffer_bytes_(label_offset_ + batch_size * sizeof(int64_t)),
        max_free_(max_free) {}

  std::unique_ptr<BatchBuffer> Take() {
    {
      std::lock_guard<std::mutex> g(mu_);
      ++outstanding_;
      // Lent buffers first: a GPU copies from them without staging.
      for (auto* list : {&lent_, &free_}) {
        if (!list->empty()) {
          auto b = std::move(list->back());
          list->pop_back();
          return b;
        }
      }
    }
    auto b = std::make_unique<BatchBuffer>();
    b->owned.resize(buffer_bytes_);  // operator new's alignment: at least the labels'
    b->label_offset = label_offset_;
    return b;
  }

  size_t buffer_bytes() const { return buffer_bytes_; }

  Status Adopt(std::vector<ExternalBuffer> buffers) {
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (buffers[i].data == nullptr || buffers[i].size < buffer_bytes_) {
        return InvalidArgumentError("Loader: lent buffer " + std::to_string(i) + " holds " +
                                    std::to_string(buffers[i].size) + " bytes; a batch's images and labels need " +
                                    std::to_string(buffer_bytes_));
      }
      if (reinterpret_cast<uintptr_t>(buffers[i].data) % alignof(int64_t) != 0) {
        return InvalidArgumentError("Loader: lent buffer " + std::to_string(i) +
                                    " is not 8-byte aligned (its labels are int64)");
      }
    }
    std::lock_guard<std::mutex> g(mu_);
    for (auto& e : buffers) {
      auto b = std::make_unique<BatchBuffer>();
      b->external = std::move(e);
      b->label_offset = label_offset_;
      lent_.push_back(std::move(b));
    }
    return Status::Ok();
  }

  void Return(std::unique_ptr<BatchBuffer> b) {
    // A batch of the parent's freed in a fork()ed child: its buffer goes (this process's
    // copy) without mu_, which a parent's thread that does not exist here may hold.
    if (!owner_.here()) return;
    std::lock_guard<std::mutex> g(mu_);
    --outstanding_;
    if (b->external.data != nullptr) {
      lent_.push_back(std::move(b));  // kept whatever the count: the caller sized them
    } else if (free_.size() < max_free_) {
      free_.push_back(std::move(b));
    }
  }

  // Buffers taken and not yet returned (in flight or held by the caller).
  size_t outstanding() {
    std::lock_guard<std::mutex> g(mu_);
    return outstanding_;
  }

 private:
  ProcessOwner owner_;
  std::mutex mu_;
  size_t label_offset_, buffer_bytes_, max_free_;
  size_t outstanding_ = 0;
  std::vector<std::unique_ptr<BatchBuffer>> free_;
  std::vector<std::unique_ptr<BatchBuffer>> lent_;  // buffers the caller lent, free
};

BufferLease::BufferLease(std::shared_ptr<BufferPool> pool, std::unique_ptr<BatchBuffer> buf)
    : pool_(std::move(pool)), buf_(std::move(buf)) {}

BufferLease::~BufferLease() { pool_->Return(std::move(buf_)); }

// ---- state ----------------------------------------------------------------------------

struct Loader::BatchState {
  int64_t index = 0;
  uint64_t epoch = 0;
  std::shared_ptr<BufferLease> lease;
  std::vector<int64_t> samples;  // dataset indices, one per slot
  std::vector<Status> status;    // per slot, written by the worker that owns the slot
  std::vector<int64_t> labels;   // per slot (the keys' labels, or a SampleSource's)
  std::vector<std::vector<SampleField>> fields;  // per slot, from a SampleSource
  std::vector<std::string> urls;                 // per slot, from a SampleSource
  std::atomic<int64_t> remaining{0};
  std::atomic<bool> cancelled{false};
};

struct Loader::Task {
  std::shared_ptr<BatchState> batch;
  size_t slot = 0;
  std::optional<std::string> bytes;  // already fetched (batched fetch) or not
  std::string url = {};              // a SampleSource's name for the sample
};

Result<std::unique_ptr<Loader>> Loader::Create(std::shared_ptr<Store> store, std::vector<std::string> keys,
                                               std::vector<int64_t> labels, image::Pipeline pipeline,
                                               const LoaderOptions& options) {
  if (!store) return InvalidArgumentError("Loader: no store");
  if (keys.size() != labels.size()) {
    return InvalidArgumentError("Loader: " + std::to_string(keys.size()) + " keys but " +
                                std::to_string(labels.size()) + " labels");
  }
  if (options.batch_size < 1) return InvalidArgumentError("batch_size must be >= 1, got " + std::to_string(options.batch_size));
  if (options.prefetch < 1) return InvalidArgumentError("prefetch must be >= 1, got " + std::to_string(options.prefetch));
  if (options.num_threads < 0) return InvalidArgumentError("num_threads must be >= 0");
  DDP_ASSIGN_OR_RETURN(DistributedSampler sampler,
                       DistributedSampler::Create(static_cast<int64_t>(keys.size()), options.sampler));
  return std::unique_ptr<Loader>(new Loader(std::move(store), std::move(keys), std::move(labels),
                                            std::move(pipeline), options, std::move(sampler)));
}

Result<std::unique_ptr<Loader>> Loader::Create(std::shared_ptr<SampleSource> source, image::Pipeline pipeline,
                                               const LoaderOptions& options) {
  if (!source) return InvalidArgumentError("Loader: no sample source");
  LoaderOptions o = options;
  o.batched_fetch = true;
  o.sampler.world_size = 1;  // the source deals samples to ranks
  o.sampler.rank = 0;
  DDP_ASSIGN_OR_RETURN(std::unique_ptr<Loader> loader,
                       Create(std::make_shared<NoStore>(), {}, {}, std::move(pipeline), o));
  loader->source_ = std::move(source);
  return loader;
}

Loader::Loader(std::shared_ptr<Store> store, std::vector<std::string> keys, std::vector<int64_t> labels,
               image::Pipeline pipeline, const LoaderOptions& options, DistributedSampler sampler)
    : store_(std::move(store)), keys_(std::move(keys)), labels_(std::move(labels)),
      pipeline_(std::move(pipeline)), opt_(options), sampler_(std::move(sampler)) {
  key_samples_ = sampler_.num_samples();
  pool_ = std::make_shared<BufferPool>(pipeline_.sample_bytes() * static_cast<size_t>(opt_.batch_size),
                                       static_cast<size_t>(opt_.batch_size), static_cast<size_t>(opt_.prefetch));
  int n = opt_.num_threads > 0 ? opt_.num_threads : static_cast<int>(std::thread::hardware_concurrency());
  n = std::max(n, 1);
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { WorkerLoop(); });
  if (opt_.batched_fetch) threads_.emplace_back([this] { FetchLoop(); });
}

size_t Loader::batch_buffer_bytes() const { return pool_->buffer_bytes(); }

Status Loader::AdoptBuffers(std::vector<ExternalBuffer> buffers) {
  if (Status st = CheckProcess(); !st.ok()) return st;
  return pool_->Adopt(std::move(buffers));
}

Loader::~Loader() {
  if (owner_.here()) {
    Shutdown();
    return;
  }
  // A fork()ed child frees the parent's Loader (its garbage collector, a DataLoader
  // worker's): the threads are the parent's, so they are leaked rather than joined (a join
  // reads a thread descriptor glibc reclaimed at the fork, and crashes), and the condition
  // variables forget the parent's waiters (destroying one they count blocks). The rest
  // (buffers, the store, the source) frees only this process's copies, or guards itself.
  Leak(std::move(threads_));
  ForgetWaiters(work_cv_);
  ForgetWaiters(fetch_cv_);
  ForgetWaiters(done_cv_);
}

void Loader::Shutdown() {
  // In a fork()ed child there is nothing of ours to stop (see ~Loader); mu_ may even be
  // held by a parent's thread that does not exist here.
  if (!owner_.here()) return;
  std::lock_guard<std::mutex> once(shutdown_mu_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    // stop_ first: a Next() woken by the cancellation must see "closed", not "restarted".
    const bool first = !stop_;
    stop_ = true;
    if (first) CancelLocked(lock);
  }
  work_cv_.notify_all();
  fetch_cv_.notify_all();
  done_cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  }
}

namespace {
Status ClosedError() { return FailedPreconditionError("the loader is closed"); }
}  // namespace

Status Loader::CheckProcess() const {
  return owner_.Check("this Loader", "build a new Loader in this process (e.g. in the DataLoader "
                                     "worker or Pool task that reads it)");
}

int64_t Loader::num_batches() const { return BatchesOf(num_samples()); }

int64_t Loader::BatchesOf(int64_t n) const {
  const int64_t bs = opt_.batch_size;
  return opt_.drop_last ? n / bs : (n + bs - 1) / bs;
}

// ---- control --------------------------------------------------------------------------

void Loader::CancelLocked(std::unique_lock<std::mutex>& lock) {
  for (auto& [i, b] : inflight_) b->cancelled = true;
  fetch_cancel_ = true;
  tasks_.clear();
  fetch_queue_.clear();
  done_cv_.notify_all();
  // Running tasks still write into their batch's buffer (kept alive by the task); wait
  // for them so no work of the old epoch overlaps the new one.
  done_cv_.wait(lock, [this] { return busy_ == 0; });
  inflight_.clear();
}

Status Loader::StartEpoch(uint64_t epoch, int64_t start_batch) {
  DDP_RETURN_IF_ERROR(CheckProcess());
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return ClosedError();
  const int64_t nb = source_ ? BatchesOf(source_->NumSamples(epoch)) : num_batches();
  if (start_batch < 0 || start_batch > nb) {
    return OutOfRangeError("start batch " + std::to_string(start_batch) + " is outside [0, " +
                           std::to_string(nb) + "] for this epoch");
  }
  CancelLocked(lock);
  ++generation_;
  epoch_ = epoch;
  if (source_) {
    Result<std::vector<int64_t>> order = source_->Order(epoch);
    if (!order.ok()) return order.status();
    order_ = std::move(order).value();
    source_epoch_ = epoch;
  } else {
    order_ = sampler_.Indices(epoch);
  }
  next_schedule_ = next_deliver_ = start_batch;
  end_batch_ = nb;
  ScheduleLocked();
  return Status::Ok();
}

Status Loader::Restart(std::vector<std::string> keys, std::vector<int64_t> labels) {
  DDP_RETURN_IF_ERROR(CheckProcess());
  if (source_) {
    return FailedPreconditionError("Loader::Restart: this loader reads a sample source (e.g. tar shards), "
                                   "not a key list; make a new one for other samples");
  }
  if (keys.size() != labels.size()) {
    return InvalidArgumentError("Loader::Restart: " + std::to_string(keys.size()) + " keys but " +
                                std::to_string(labels.size()) + " labels");
  }
  DDP_ASSIGN_OR_RETURN(DistributedSampler sampler,
                       DistributedSampler::Create(static_cast<int64_t>(keys.size()), opt_.sampler));
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return ClosedError();
  // After the cancellation no task and no fetch runs (busy_ == 0) and none is queued: no
  // thread reads keys_ until the next StartEpoch schedules batches of the new list.
  CancelLocked(lock);
  ++generation_;
  keys_ = std::move(keys);
  labels_ = std::move(labels);
  sampler_ = std::move(sampler);
  key_samples_ = sampler_.num_samples();
  order_.clear();
  next_schedule_ = next_deliver_ = end_batch_ = 0;
  return Status::Ok();
}

void Loader::ScheduleLocked() {
  const auto bs = static_cast<int64_t>(opt_.batch_size);
  const auto prefetch = static_cast<size_t>(opt_.prefetch);
  while (inflight_.size() < prefetch && next_schedule_ < end_batch_) {
    // Batches the caller still holds count against `prefetch`, so memory stays near
    // prefetch x batch bytes; one batch is always in flight, so a caller that keeps many
    // batches still makes progress (more slowly) instead of deadlocking.
    const size_t held = pool_->outstanding() - inflight_.size();
    if (!inflight_.empty() && inflight_.size() + held >= prefetch) break;
    auto b = std::make_shared<BatchState>();
    b->index = next_schedule_++;
    b->epoch = epoch_;
    const int64_t start = b->index * bs;
    const int64_t n = std::min<int64_t>(bs, static_cast<int64_t>(order_.size()) - start);
    b->samples.assign(order_.begin() + start, order_.begin() + start + n);
    b->status.resize(static_cast<size_t>(n));
    if (!source_) {
      // Copied under mu_: Next() reads them without it, and Restart may swap labels_.
      b->labels.reserve(static_cast<size_t>(n));
      for (int64_t i : b->samples) b->labels.push_back(labels_[static_cast<size_t>(i)]);
    } else {
      b->labels.resize(static_cast<size_t>(n), -1);
      b->fields.resize(static_cast<size_t>(n));
      b->urls.resize(static_cast<size_t>(n));
    }
    b->remaining = n;
    b->lease = std::make_shared<BufferLease>(pool_, pool_->Take());
    inflight_[b->index] = b;
    if (opt_.batched_fetch) {
      fetch_queue_.push_back(b);
      fetch_cv_.notify_one();
    } else {
      for (size_t s = 0; s < b->samples.size(); ++s) tasks_.push_back(Task{b, s, std::nullopt});
      work_cv_.notify_all();
    }
  }
}

// ---- workers --------------------------------------------------------------------------

void Loader::FinishSample(BatchState& b, size_t slot, Status st) {
  b.status[slot] = std::move(st);
  if (b.remaining.fetch_sub(1) == 1) {
    std::lock_guard<std::mutex> g(mu_);  // pairs with the waiter's predicate check
    done_cv_.notify_all();
  }
}

void Loader::WorkerLoop() {
  image::Image img;  // this thread's decode buffer, reused between samples
  int64_t kept = 0;  // its capacity as counted in decode_buffer_bytes_
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
      if (stop_) {
        decode_buffer_bytes_ -= kept;
        return;
      }
      t = std::move(tasks_.front());
      tasks_.pop_front();
      ++busy_;
    }
    RunTask(t, img);
    t.batch.reset();
    // One large image must not pin its buffer (up to max_pixels x 3 bytes) for good.
    if (img.pixels.capacity() > opt_.decode_buffer_keep_bytes) img.pixels = std::vector<uint8_t>();
    const auto now = static_cast<int64_t>(img.pixels.capacity());
    decode_buffer_bytes_ += now - kept;
    kept = now;
    // Only a cancellation waits for busy_ == 0; Next() is woken by FinishSample when its
    // batch completes. Waking every waiter after every sample cost the consumer a context
    // switch per image.
    bool idle = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      idle = --busy_ == 0;
    }
    if (idle) done_cv_.notify_all();
  }
}

void Loader::RunTask(Task& t, image::Image& img) {
  BatchState& b = *t.batch;
  if (b.cancelled) {
    FinishSample(b, t.slot, CancelledError("epoch restarted"));
    return;
  }
  const int64_t idx = b.samples[t.slot];
  std::string bytes;
  if (t.bytes.has_value()) {
    bytes = std::move(*t.bytes);
  } else {
    Result<std::string> r = store_->Get(keys_[static_cast<size_t>(idx)]);
    if (!r.ok()) {
      FinishSample(b, t.slot, r.status());
      return;
    }
    bytes = std::move(r).value();
  }
  const std::string url = source_ ? t.url : store_->KeyUrl(keys_[static_cast<size_t>(idx)]);
  Result<image::ImageInfo> info = image::ReadImageInfo(bytes, url, opt_.decode);
  if (!info.ok()) {
    FinishSample(b, t.slot, info.status());
    return;
  }
  image::Rng rng = image::Rng::ForSample(opt_.sampler.seed, b.epoch, static_cast<uint64_t>(idx));
  const bool jpeg = info->format == image::Format::kJpeg;
  const image::SamplePlan plan =
      pipeline_.Plan(info->width, info->height, rng, opt_.scaled_decode && jpeg, opt_.region_decode && jpeg);
  Status st = image::DecodeImage(bytes, url, opt_.decode, plan.scale_denom, img,
                                 plan.region ? &*plan.region : nullptr);
  if (st.ok()) {
    uint8_t* dst = b.lease->buffer().images() + t.slot * pipeline_.sample_bytes();
    st = pipeline_.Apply(img, plan, dst);
    if (!st.ok()) st = st.WithContext(url);
  }
  FinishSample(b, t.slot, std::move(st));
}

void Loader::FetchLoop() {
  for (;;) {
    std::vector<std::shared_ptr<BatchState>> batches;
    {
      std::unique_lock<std::mutex> lock(mu_);
      fetch_cv_.wait(lock, [this] { return stop_ || !fetch_queue_.empty(); });
      if (stop_) return;
      // Everything queued goes out in one GetMany, so requests of consecutive batches
      // overlap instead of draining at every batch boundary.
      batches.assign(fetch_queue_.begin(), fetch_queue_.end());
      fetch_queue_.clear();
      fetch_cancel_ = false;  // under mu_: a cancellation clears the queue first
      ++busy_;
    }
    if (source_) {
      FetchFromSource(batches);
      batches.clear();
      {
        std::lock_guard<std::mutex> g(mu_);
        --busy_;
      }
      done_cv_.notify_all();
      continue;
    }
    std::vector<std::string> keys;
    std::vector<std::pair<BatchState*, size_t>> where;
    for (auto& b : batches) {
      for (size_t s = 0; s < b->samples.size(); ++s) {
        keys.push_back(keys_[static_cast<size_t>(b->samples[s])]);
        where.emplace_back(b.get(), s);
      }
    }
    std::vector<bool> called(keys.size(), false);
    Status st = store_->GetManyCancellable(
        keys,
        [&](size_t i, Result<std::string> r) {
          if (i >= where.size() || called[i]) return;
          called[i] = true;
          auto [b, slot] = where[i];
          std::shared_ptr<BatchState> owner;
          for (auto& sp : batches) {
            if (sp.get() == b) owner = sp;
          }
          if (!r.ok()) return Fetched(owner, slot, r.status(), {}, {});
          Fetched(owner, slot, Status::Ok(), std::move(r).value(), {});
        },
        opt_.max_in_flight, fetch_cancel_);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (called[i]) continue;
      Status missing = st.ok() ? InternalError(store_->KeyUrl(keys[i]) + ": GetMany returned without it") : st;
      FinishSample(*where[i].first, where[i].second, std::move(missing));
    }
    batches.clear();
    {
      std::lock_guard<std::mutex> g(mu_);
      --busy_;
    }
    done_cv_.notify_all();
  }
}

void Loader::Fetched(const std::shared_ptr<BatchState>& b, size_t slot, Status st, std::string bytes,
                     std::string url) {
  if (b->cancelled) {
    FinishSample(*b, slot, CancelledError("epoch restarted"));
  } else if (!st.ok()) {
    FinishSample(*b, slot, std::move(st));
  } else {
    std::lock_guard<std::mutex> g(mu_);
    tasks_.push_back(Task{b, slot, std::move(bytes), std::move(url)});
    work_cv_.notify_one();
  }
}

void Loader::FetchFromSource(const std::vector<std::shared_ptr<BatchState>>& batches) {
  std::vector<int64_t> positions;
  std::vector<std::pair<BatchState*, size_t>> where;
  std::vector<const std::shared_ptr<BatchState>*> owners;
  for (auto& b : batches) {
    for (size_t s = 0; s < b->samples.size(); ++s) {
      positions.push_back(b->index * opt_.batch_size + static_cast<int64_t>(s));
      where.emplace_back(b.get(), s);
      owners.push_back(&b);
    }
  }
  std::vector<bool> called(positions.size(), false);
  Status st = source_->Fetch(
      positions,
      [&](size_t i, Result<SourceSample> r) {
        if (i >= where.size() || called[i]) return;
        called[i] = true;
        auto [b, slot] = where[i];
        if (!r.ok()) return Fetched(*owners[i], slot, r.status(), {}, {});
        b->labels[slot] = r->label;
        b->fields[slot] = std::move(r->fields);
        b->urls[slot] = r->url;
        if (!opt_.decode_images) return FinishSample(*b, slot, Status::Ok());  // nothing to decode
        Fetched(*owners[i], slot, Status::Ok(), std::move(r->bytes), std::move(r->url));
      },
      fetch_cancel_);
  for (size_t i = 0; i < positions.size(); ++i) {
    if (called[i]) continue;
    Status missing = st.ok() ? InternalError("sample source returned without position " + std::to_string(positions[i])) : st;
    FinishSample(*where[i].first, where[i].second, std::move(missing));
  }
}

// ---- delivery -------------------------------------------------------------------------

bool Loader::Skippable(const Status& s) const {
  if (!opt_.skip_errors) return false;
  return IsBadImage(s) || (opt_.skip_missing && s.code() == Code::kNotFound);
}

Result<std::optional<Batch>> Loader::Next() {
  DDP_RETURN_IF_ERROR(CheckProcess());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stop_) return ClosedError();
    if (next_deliver_ >= end_batch_) return std::optional<Batch>();
    ScheduleLocked();
    auto it = inflight_.find(next_deliver_);
    if (it == inflight_.end()) return InternalError("loader: batch " + std::to_string(next_deliver_) + " was never scheduled");
    std::shared_ptr<BatchState> b = it->second;
    done_cv_.wait(lock, [&] { return b->remaining.load() == 0 || b->cancelled.load() || stop_; });
    if (stop_) return ClosedError();
    if (b->cancelled) return CancelledError("loader: epoch restarted while waiting for a batch");
    inflight_.erase(b->index);
    ++next_deliver_;
    ScheduleLocked();
    lock.unlock();

    BatchBuffer& buf = b->lease->buffer();
    const size_t sb = opt_.decode_images ? pipeline_.sample_bytes() : 0;
    int64_t kept = 0, skipped = 0;
    std::vector<size_t> good;
    for (size_t s = 0; s < b->samples.size(); ++s) {
      if (!b->status[s].ok()) {
        if (!Skippable(b->status[s])) return b->status[s];
        ++skipped;
        continue;
      }
      good.push_back(s);
      if (static_cast<int64_t>(s) != kept) {
        std::memmove(buf.images() + kept * sb, buf.images() + s * sb, sb);
      }
      buf.labels()[kept] = b->labels[s];
      ++kept;
    }
    skipped_ += skipped;
    if (kept == 0) {
      lock.lock();
      continue;  // every sample failed and was skipped
    }
    Batch out;
    if (source_) {
      Result<std::vector<FieldColumn>> fields = StackFields(*b, good);
      if (!fields.ok()) return fields.status();
      out.fields = std::move(fields).value();
    }
    out.lease = b->lease;
    out.images = buf.images();
    out.labels = buf.labels();
    out.size = kept;
    out.index = b->index;
    out.skipped = skipped;
    return std::optional<Batch>(std::move(out));
  }
}

Result<std::vector<FieldColumn>> Loader::StackFields(BatchState& b, const std::vector<size_t>& kept) const {
  std::vector<FieldColumn> out;
  if (kept.empty()) return out;
  const size_t nf = b.fields[kept[0]].size();
  for (size_t f = 0; f < nf; ++f) {
    const std::string name = f < opt_.field_names.size() ? opt_.field_names[f] : std::to_string(f);
    const SampleField& first = b.fields[kept[0]][f];
    FieldColumn c;
    c.kind = first.kind;
    c.dtype_kind = first.dtype_kind;
    c.itemsize = first.itemsize;
    c.shape = first.shape;
    uint64_t each = static_cast<uint64_t>(first.itemsize);
    for (int64_t d : first.shape) each *= static_cast<uint64_t>(d);
    if (c.kind == FieldKind::kArray) c.data = std::make_shared<std::vector<uint8_t>>(each * kept.size());
    for (size_t k = 0; k < kept.size(); ++k) {
      SampleField& x = b.fields[kept[k]][f];
      if (x.kind != c.kind) return InternalError("field '" + name + "' changed kind within a batch");
      if (c.kind == FieldKind::kInt) {
        c.ints.push_back(x.value);
      } else if (c.kind == FieldKind::kBytes) {
        c.raw.push_back(std::move(x.bytes));
      } else {
        if (x.shape != c.shape || x.dtype_kind != c.dtype_kind || x.itemsize != c.itemsize) {
          auto describe = [](const SampleField& a) {
            std::string s = "(";
            for (size_t i = 0; i < a.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(a.shape[i]);
            return s + (a.shape.size() == 1 ? ",)" : ")") + " " + a.dtype_kind + std::to_string(a.itemsize * 8);
          };
          return InvalidArgumentError("cannot stack the '" + name + "' arrays of batch " + std::to_string(b.index) +
                                      ": " + b.urls[kept[0]] + " has shape " + describe(first) + ", " +
                                      b.urls[kept[k]] + " has " + describe(x));
        }
        if (x.data_offset + each > x.bytes.size()) {
          return InternalError(b.urls[kept[k]] + ": array data past its member");
        }
        std::memcpy(c.data->data() + k * each, x.bytes.data() + x.data_offset, each);
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace ddp::pipeline
