#include "table/batch_stream.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

namespace ddp::table {
namespace {

size_t Aligned(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

struct BatchStream::Lent {
  ProcessOwner owner;
  std::mutex mu;
  std::vector<LentBuffer> free;
  bool closed = false;  // buffers coming back are dropped
};

BatchStream::BatchStream(std::vector<size_t> output_row_bytes, size_t batch_size,
                         size_t prefetch, size_t max_jobs, GatherPool* pool, bool ahead)
    : output_row_bytes_(std::move(output_row_bytes)),
      batch_size_(std::max<size_t>(1, batch_size)),
      prefetch_(std::max<size_t>(1, prefetch)),
      max_jobs_(std::max<size_t>(1, max_jobs)),
      pool_(pool),
      ahead_(ahead),
      lent_(std::make_shared<Lent>()) {
  if (ahead_) worker_ = std::thread([this] { Run(); });
}

BatchStream::~BatchStream() {
  if (owner_.here()) {
    Close();
    return;
  }
  // A fork()ed child: the thread is the parent's, and mu_ may be held by it
  // (common/process.h).
  Leak(std::move(worker_));
  ForgetWaiters(changed_);
}

Status BatchStream::CheckProcess() const {
  return owner_.Check("the table's batch stream", "build a new Loader in this process");
}

Status BatchStream::Push(BatchJob job) {
  if (job.layout == nullptr) {
    return InvalidArgumentError("table batches: a job without a window");
  }
  if (job.layout->output_row_bytes != output_row_bytes_) {
    return InvalidArgumentError("table batches: a job's window has " +
                                std::to_string(job.layout->output_row_bytes.size()) +
                                " outputs whose rows do not match the stream's " +
                                std::to_string(output_row_bytes_.size()));
  }
  if (job.segment.size() != job.row.size()) {
    return InvalidArgumentError("table batches: a job has " + std::to_string(job.segment.size()) +
                                " segment indices for " + std::to_string(job.row.size()) +
                                " rows");
  }
  DDP_RETURN_IF_ERROR(CheckProcess());
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return closed_ || worker_done_ || unfinished_ < max_jobs_; });
  if (closed_) return CancelledError("table batches: the stream is closed");
  if (worker_done_ && !finished_) {
    return CancelledError("table batches: the stream ended on an earlier gather error");
  }
  if (finished_) return FailedPreconditionError("table batches: a job pushed after Finish");
  jobs_.push_back(std::move(job));
  ++unfinished_;
  changed_.notify_all();
  return Status::Ok();
}

void BatchStream::Finish() {
  if (!owner_.here()) return;  // a fork()ed child: Push and Next fail there anyway
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = true;
  changed_.notify_all();
}

Status BatchStream::Next(Batch* batch, bool* end, double timeout_s) {
  *end = false;
  DDP_RETURN_IF_ERROR(CheckProcess());
  if (!ahead_) return NextInline(batch, end, timeout_s);
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return closed_ || worker_done_ || !ready_.empty(); };
  if (timeout_s < 0) {
    changed_.wait(lock, ready);
  } else if (!changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), ready)) {
    return DeadlineExceededError("table batches: no batch within " + std::to_string(timeout_s) +
                                 " s");
  }
  if (!closed_ && !ready_.empty()) {
    *batch = std::move(ready_.front());
    ready_.pop_front();
    changed_.notify_all();
    return Status::Ok();
  }
  *end = true;
  if (closed_) return Status::Ok();
  return std::exchange(error_, Status::Ok());  // reported once
}

void BatchStream::Close() {
  if (!owner_.here()) return;  // nothing of ours to stop in a fork()ed child (~BatchStream)
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    changed_.notify_all();
  }
  std::vector<LentBuffer> lent;
  {
    std::lock_guard<std::mutex> g(lent_->mu);
    lent_->closed = true;
    lent.swap(lent_->free);
  }
  lent.clear();  // their keepers run outside the lock
  std::lock_guard<std::mutex> join(join_mu_);  // two threads closing at once join once
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

uint64_t BatchStream::jobs_done() const {
  if (!owner_.here()) return done_;  // a fork()ed child's copy, which no thread changes
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void BatchStream::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return closed_ || finished_ || !jobs_.empty(); });
    if (closed_ || jobs_.empty()) break;  // closed, or finished with every job done
    BatchJob job = std::move(jobs_.front());
    jobs_.pop_front();
    const size_t n = job.row.size();
    for (size_t begin = 0; begin < n; begin += batch_size_) {
      changed_.wait(lock, [&] { return closed_ || ready_.size() < prefetch_; });
      if (closed_) break;
      lock.unlock();
      Batch batch;
      const Status status = Gather(job, begin, std::min(n, begin + batch_size_) - begin, &batch);
      lock.lock();
      if (!status.ok()) {
        error_ = status;
        worker_done_ = true;
        changed_.notify_all();
        return;
      }
      ready_.push_back(std::move(batch));
      changed_.notify_all();
    }
    if (closed_) break;
    JobDone(lock, std::move(job));
  }
  worker_done_ = true;
  changed_.notify_all();
}

size_t BatchStream::batch_buffer_bytes() const {
  size_t total = 0;
  for (size_t bytes : output_row_bytes_) total += Aligned(batch_size_ * bytes);
  return total;
}

Status BatchStream::AdoptBuffers(std::vector<LentBuffer> buffers) {
  const size_t need = batch_buffer_bytes();
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].data == nullptr || buffers[i].size < need) {
      return InvalidArgumentError("table batches: lent buffer " + std::to_string(i) + " holds " +
                                  std::to_string(buffers[i].size) + " bytes; a batch's outputs need " +
                                  std::to_string(need));
    }
    if (reinterpret_cast<uintptr_t>(buffers[i].data) % alignof(int64_t) != 0) {
      return InvalidArgumentError("table batches: lent buffer " + std::to_string(i) +
                                  " is not 8-byte aligned");
    }
  }
  std::lock_guard<std::mutex> g(lent_->mu);
  if (lent_->closed) return CancelledError("table batches: the stream is closed");
  for (LentBuffer& b : buffers) lent_->free.push_back(std::move(b));
  return Status::Ok();
}

std::shared_ptr<uint8_t[]> BatchStream::TakeLent() const {
  std::lock_guard<std::mutex> g(lent_->mu);
  if (lent_->free.empty()) return nullptr;
  LentBuffer b = std::move(lent_->free.back());
  lent_->free.pop_back();
  uint8_t* data = b.data;
  return std::shared_ptr<uint8_t[]>(data, [pool = lent_, b](uint8_t*) mutable {
    // In a fork()ed child the buffer goes (this process's copy) without the lock, which a
    // parent's thread that does not exist here may hold.
    if (!pool->owner.here()) return;
    std::unique_lock<std::mutex> lock(pool->mu);
    if (!pool->closed) {
      pool->free.push_back(std::move(b));
      return;
    }
    lock.unlock();
    b = LentBuffer();  // its keeper runs outside the lock
  });
}

Status BatchStream::Gather(const BatchJob& job, size_t begin, size_t rows, Batch* batch) const {
  batch->rows = rows;
  batch->outputs.clear();
  std::vector<uint8_t*> outs;
  std::shared_ptr<uint8_t[]> lease = TakeLent();
  size_t at = 0;
  for (size_t bytes : output_row_bytes_) {
    if (lease != nullptr) {
      batch->outputs.emplace_back(lease, lease.get() + at);  // shares the lease
      at += Aligned(batch_size_ * bytes);
    } else {
      batch->outputs.emplace_back(new uint8_t[std::max<size_t>(1, rows * bytes)]);
    }
    outs.push_back(batch->outputs.back().get());
  }
  return GatherRows(*job.layout, std::span<const int32_t>(job.segment).subspan(begin, rows),
                    std::span<const int64_t>(job.row).subspan(begin, rows), outs, pool_);
}

void BatchStream::JobDone(std::unique_lock<std::mutex>& lock, BatchJob job) {
  lock.unlock();
  job = BatchJob();  // the window's buffers are no longer read from here
  lock.lock();
  --unfinished_;
  ++done_;
  changed_.notify_all();
}

Status BatchStream::NextInline(Batch* batch, bool* end, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, timeout_s)));
  auto ready = [&] { return closed_ || worker_done_ || finished_ || !jobs_.empty(); };
  while (true) {
    if (!current_) {
      if (timeout_s < 0) {
        changed_.wait(lock, ready);
      } else if (!changed_.wait_until(lock, deadline, ready)) {
        return DeadlineExceededError("table batches: no batch within " +
                                     std::to_string(timeout_s) + " s");
      }
      if (closed_ || worker_done_ || jobs_.empty()) {  // closed, failed, or finished
        *end = true;
        worker_done_ = true;
        changed_.notify_all();
        return closed_ ? Status::Ok() : std::exchange(error_, Status::Ok());
      }
      current_.emplace(std::move(jobs_.front()));
      jobs_.pop_front();
      cursor_ = 0;
    }
    if (cursor_ >= current_->row.size()) {  // every batch of the job is out
      BatchJob job = std::move(*current_);
      current_.reset();
      JobDone(lock, std::move(job));
      continue;
    }
    const size_t begin = cursor_;
    const size_t rows = std::min(current_->row.size(), begin + batch_size_) - begin;
    cursor_ += rows;
    // The consumer's own thread: only Close() touches the state meanwhile.
    lock.unlock();
    Status status = Gather(*current_, begin, rows, batch);
    lock.lock();
    if (closed_) {
      *batch = Batch();
      *end = true;
      return Status::Ok();
    }
    if (!status.ok()) {
      *batch = Batch();
      *end = true;
      worker_done_ = true;
      current_.reset();
      changed_.notify_all();
      return status;
    }
    if (cursor_ >= current_->row.size()) {  // the job's last batch: its window is free
      BatchJob job = std::move(*current_);
      current_.reset();
      JobDone(lock, std::move(job));
    }
    return Status::Ok();
  }
}

}  // namespace ddp::table
