// Tar shards as a Loader's sample source: each needed shard is fetched whole through the
// Store (several at once, the next ones ahead of need), parsed, and its samples handed to
// the Loader's decode threads in the epoch's order (shards/order.h). A shard stays in
// memory while its samples are still due soon, and is fetched again if due much later
// (the padding at an epoch's end).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/store.h"
#include "pipeline/sample_source.h"
#include "shards/order.h"
#include "shards/tar.h"

namespace ddp::shards {

struct ShardSourceOptions {
  ShardOrderOptions order;
  TarParseOptions parse;
  int lookahead_shards = 2;  // shards fetched ahead of need
  int max_in_flight = 0;     // concurrent shard requests (0: the store's option)
  // A shard the store refuses to return in one answer (over its max_body_bytes) is read
  // with ranged GETs of this many bytes each.
  uint64_t range_bytes = 256ull << 20;
};

class ShardSource : public pipeline::SampleSource {
 public:
  // `keys` name the shards in `store`; counts[i] is the number of samples of keys[i].
  static Result<std::shared_ptr<ShardSource>> Create(std::shared_ptr<Store> store, std::vector<std::string> keys,
                                                     std::vector<int64_t> counts, const ShardSourceOptions& options);

  // For `epoch` only, read these segments instead of every shard whole (resuming after
  // the world size changed: the samples not yet read). Call before the Loader starts
  // that epoch.
  Status SetEpochSegments(uint64_t epoch, std::vector<Segment> segments);

  Result<std::vector<int64_t>> Order(uint64_t epoch) override;
  int64_t NumSamples(uint64_t epoch) const override;
  Status Fetch(std::span<const int64_t> positions, const pipeline::SampleCallback& cb,
               const std::atomic<bool>& cancel) override;
  int64_t skipped() const override { return skipped_.load(); }

 private:
  struct Loaded;
  ShardSource() = default;
  Result<RankOrder> Plan(uint64_t epoch) const;
  Result<std::shared_ptr<Loaded>> Parse(int64_t shard, std::string data);
  void Deliver(int64_t position, size_t index, const pipeline::SampleCallback& cb);

  std::shared_ptr<Store> store_;
  std::vector<std::string> keys_;
  std::vector<int64_t> counts_, prefix_;
  ShardSourceOptions opt_;
  mutable std::mutex epoch_mu_;  // SetEpochShards and Plan may run on different threads
  std::map<uint64_t, std::vector<Segment>> epoch_segments_;  // overrides by epoch
  // The current epoch: its order, each shard's positions in it, the shards in memory.
  std::vector<int64_t> order_;
  std::map<int64_t, std::vector<int64_t>> uses_;
  std::map<int64_t, std::shared_ptr<Loaded>> loaded_;
  std::atomic<int64_t> skipped_{0};
};

// The number of samples in each shard (each fetched and parsed; several at once; one
// over the store's max_body_bytes in ranges of `range_bytes`). With options.skip_errors,
// bad samples are left out and added to `*skipped`.
Result<std::vector<int64_t>> CountSamples(Store& store, const std::vector<std::string>& keys,
                                          const TarParseOptions& options, int max_in_flight, int64_t* skipped,
                                          uint64_t range_bytes = ShardSourceOptions{}.range_bytes);

// A whole object read with ranged GETs of `range_bytes` each (stops when `cancel`).
Result<std::string> GetInRanges(Store& store, const std::string& key, uint64_t range_bytes,
                                const std::atomic<bool>& cancel);

}  // namespace ddp::shards
