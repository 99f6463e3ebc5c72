// Reads objects as consecutive byte ranges ("chunks") on background threads, ahead of
// their consumer, in bounded memory: at most `objects_ahead` objects are read at once
// (the one being consumed and the next ones), each with at most `chunks_ahead` chunks
// waiting. Objects are consumed in order; the consumer releases one when done with it,
// which stops its reading (the rest of a shard no one needs is never fetched).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "ddp/store.h"

namespace ddp::shards {

struct PrefetchOptions {
  uint64_t chunk_bytes = 8ull << 20;  // bytes per ranged GET
  int objects_ahead = 3;              // objects read at once (reader threads)
  int chunks_ahead = 2;               // chunks waiting per object
};

class ChunkPrefetcher {
 public:
  // Reads `keys` of `store` in that order (a key may repeat).
  ChunkPrefetcher(std::shared_ptr<Store> store, std::vector<std::string> keys, const PrefetchOptions& options);
  // Stops the readers (a GET in progress completes first); in a fork()ed child, leaves
  // them to the parent (common/process.h).
  ~ChunkPrefetcher();
  ChunkPrefetcher(const ChunkPrefetcher&) = delete;
  ChunkPrefetcher& operator=(const ChunkPrefetcher&) = delete;

  // The next chunk of object `k` (objects taken in order, each until its end or its
  // release): nullopt at its end; kCancelled once `cancel` is true.
  Result<std::optional<std::string>> Next(size_t k, const std::atomic<bool>& cancel);
  // Object `k` is no longer needed: its reading stops and the next object may start.
  void Release(size_t k);
  // Bytes fetched and not yet taken (for tests of the memory bound).
  uint64_t waiting_bytes() const { return waiting_.load(); }
  // Bytes fetched in all.
  uint64_t fetched_bytes() const { return fetched_.load(); }

 private:
  struct Slot {
    std::deque<std::string> chunks;
    bool eof = false;
    bool released = false;
    Status error;
  };
  void ReaderLoop();
  void ReadObject(size_t k);

  ProcessOwner owner_;
  std::shared_ptr<Store> store_;
  std::vector<std::string> keys_;
  PrefetchOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // readers and the consumer wait here
  std::vector<Slot> slots_;
  size_t next_ = 0;       // the next object a reader takes
  size_t released_ = 0;   // objects before this one are all released
  bool stop_ = false;
  std::atomic<uint64_t> fetched_{0};
  std::atomic<uint64_t> waiting_{0};
  std::vector<std::thread> threads_;
};

}  // namespace ddp::shards
