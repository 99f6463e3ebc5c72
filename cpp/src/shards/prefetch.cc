#include "shards/prefetch.h"

#include <algorithm>
#include <chrono>

namespace ddp::shards {

ChunkPrefetcher::ChunkPrefetcher(std::shared_ptr<Store> store, std::vector<std::string> keys,
                                 const PrefetchOptions& options)
    : store_(std::move(store)), keys_(std::move(keys)), opt_(options), slots_(keys_.size()) {
  opt_.chunk_bytes = std::max<uint64_t>(opt_.chunk_bytes, 1);
  opt_.objects_ahead = std::max(opt_.objects_ahead, 1);
  opt_.chunks_ahead = std::max(opt_.chunks_ahead, 1);
  const size_t n = std::min(keys_.size(), static_cast<size_t>(opt_.objects_ahead));
  for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { ReaderLoop(); });
}

ChunkPrefetcher::~ChunkPrefetcher() {
  if (!owner_.here()) {
    // A fork()ed child: the readers are the parent's threads (common/process.h).
    Leak(std::move(threads_));
    ForgetWaiters(cv_);
    return;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ChunkPrefetcher::ReaderLoop() {
  for (;;) {
    size_t k = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // An object starts once it is within `objects_ahead` of the oldest unreleased one.
      cv_.wait(lock, [&] {
        return stop_ || next_ >= keys_.size() || next_ < released_ + static_cast<size_t>(opt_.objects_ahead);
      });
      if (stop_ || next_ >= keys_.size()) return;
      k = next_++;
    }
    ReadObject(k);
  }
}

void ChunkPrefetcher::ReadObject(size_t k) {
  const std::string& key = keys_[k];
  for (uint64_t offset = 0;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || slots_[k].released || slots_[k].chunks.size() < static_cast<size_t>(opt_.chunks_ahead);
      });
      if (stop_ || slots_[k].released) return;
    }
    Result<std::string> r = store_->Get(key, ByteRange{offset, opt_.chunk_bytes});
    // A range starting at the end is out of range on some stores: the object ended.
    const bool at_end = !r.ok() && r.status().code() == Code::kOutOfRange && offset > 0;
    std::lock_guard<std::mutex> g(mu_);
    Slot& s = slots_[k];
    if (s.released) return;
    if (at_end) {
      s.eof = true;
    } else if (!r.ok()) {
      s.error = r.status();
    } else {
      const uint64_t got = r->size();
      fetched_ += got;
      waiting_ += got;
      if (got > 0) s.chunks.push_back(std::move(r).value());
      if (got < opt_.chunk_bytes) s.eof = true;
      offset += got;
    }
    cv_.notify_all();
    if (s.eof || !s.error.ok()) return;
  }
}

Result<std::optional<std::string>> ChunkPrefetcher::Next(size_t k, const std::atomic<bool>& cancel) {
  if (k >= keys_.size()) return OutOfRangeError("prefetch: object " + std::to_string(k) + " of " + std::to_string(keys_.size()));
  std::unique_lock<std::mutex> lock(mu_);
  Slot& s = slots_[k];
  for (;;) {
    if (!s.chunks.empty()) {
      std::string c = std::move(s.chunks.front());
      s.chunks.pop_front();
      waiting_ -= c.size();
      cv_.notify_all();
      return std::optional<std::string>(std::move(c));
    }
    if (!s.error.ok()) return s.error;
    if (s.eof) return std::optional<std::string>();
    if (cancel) return CancelledError(store_->KeyUrl(keys_[k]) + ": cancelled");
    // The cancel flag is set without notifying this condition variable: poll it.
    cv_.wait_for(lock, std::chrono::milliseconds(20));
  }
}

void ChunkPrefetcher::Release(size_t k) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (k >= slots_.size()) return;
    slots_[k].released = true;
    for (const std::string& c : slots_[k].chunks) waiting_ -= c.size();
    slots_[k].chunks.clear();
    while (released_ < slots_.size() && slots_[released_].released) ++released_;
  }
  cv_.notify_all();
}

}  // namespace ddp::shards
