// Tar shards as a Loader's sample source. The rank's parts of the epoch (shards/order.h)
// are read in order as streams of ranged GETs through the Store (shards/prefetch.h: the
// current part and the next ones at once, each a few chunks ahead), parsed as the bytes
// arrive (TarStream), and each sample of the rank's ranges is handed to the Loader's
// decode threads as soon as its position in the epoch's order is due.
//
// Memory per rank is bounded whatever the shard size: the read window,
// (lookahead_shards + 1) x chunks_ahead x range_bytes (48 MiB by default), plus the
// samples parsed and not yet due (at most the shuffle buffer's plus the batches in
// flight, each its encoded bytes), plus the member being parsed (the largest sample).
// A part that ends before its shard does stops reading it; a part that starts inside
// its shard parses (without keeping) the samples before its range.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ddp/store.h"
#include "pipeline/sample_source.h"
#include "shards/npy.h"
#include "shards/order.h"
#include "shards/prefetch.h"
#include "shards/tar.h"

namespace ddp::shards {

struct ShardSourceOptions {
  ShardOrderOptions order;
  TarParseOptions parse;
  int lookahead_shards = 2;  // parts read ahead of the one being parsed
  int chunks_ahead = 2;      // chunks of each part read ahead of its parser
  int max_in_flight = 0;     // CountSamples: shards counted at once (0: 8)
  uint64_t range_bytes = 8ull << 20;  // bytes per ranged GET
};

class ShardSource : public pipeline::SampleSource {
 public:
  // `keys` name the shards in `store`; counts[i] is the number of samples of keys[i].
  static Result<std::shared_ptr<ShardSource>> Create(std::shared_ptr<Store> store, std::vector<std::string> keys,
                                                     std::vector<int64_t> counts, const ShardSourceOptions& options);
  ~ShardSource() override;

  // For `epoch` only, read these segments instead of every shard whole (resuming after
  // the world size changed: the samples not yet read). Call before the Loader starts
  // that epoch.
  Status SetEpochSegments(uint64_t epoch, std::vector<Segment> segments);
  // Whether samples carry an image for the Loader to decode (without options.parse.fields,
  // always; with them, when one field is jpg, jpeg or png).
  bool has_images() const { return opt_.parse.fields.empty() || image_field_ >= 0; }
  // The names of the fields other than the image, in order (the Loader's field_names).
  std::vector<std::string> field_names() const;

  Result<std::vector<int64_t>> Order(uint64_t epoch) override;
  int64_t NumSamples(uint64_t epoch) const override;
  Status Fetch(std::span<const int64_t> positions, const pipeline::SampleCallback& cb,
               const std::atomic<bool>& cancel) override;
  int64_t skipped() const override { return skipped_.load(); }

  // Bytes of shards parsed since the source was made (fetched and used; chunks read
  // ahead past a part's end are not counted).
  uint64_t parsed_bytes() const { return parsed_bytes_.load(); }
  // The most bytes held at once since the source was made: chunks read ahead, the
  // parser's buffer, samples parsed and not yet due.
  uint64_t peak_held_bytes() const { return peak_held_.load(); }

 private:
  // One stream over a shard: consecutive parts of the same shard, ranges increasing.
  struct Read {
    int64_t shard = 0;
    std::vector<Segment> ranges;
  };
  ShardSource() = default;
  Result<RankOrder> Plan(uint64_t epoch) const;
  // Parses on: one more sample of the current read, or one more chunk of its bytes.
  // Returns false once every read is done.
  Result<bool> Advance(const std::atomic<bool>& cancel);
  void EndRead(Status why);
  int ReadOf(int64_t id) const;  // the read holding global id `id` (-1: none)
  // A parsed sample as the Loader takes it: the image field apart, the others parsed.
  Result<pipeline::SourceSample> ToSource(TarSample s, const std::string& url) const;

  std::shared_ptr<Store> store_;
  std::vector<std::string> keys_;
  std::vector<int64_t> counts_, prefix_;
  ShardSourceOptions opt_;
  int image_field_ = -1;  // with parse.fields: the image's (-1: none)
  std::vector<pipeline::FieldKind> kinds_;  // of the other fields, in order
  mutable std::mutex epoch_mu_;  // SetEpochSegments and Plan may run on different threads
  std::map<uint64_t, std::vector<Segment>> epoch_segments_;  // overrides by epoch
  // The current epoch (touched by the Loader's one fetch thread, and by Order()).
  std::vector<int64_t> order_;
  std::vector<Read> reads_;
  std::vector<std::pair<int64_t, int>> starts_;  // (first global id of a range, its read), sorted
  std::unique_ptr<ChunkPrefetcher> prefetch_;
  std::atomic<uint64_t> parsed_bytes_{0};
  size_t cur_ = 0;                      // the read being parsed
  std::unique_ptr<TarStream> stream_;   // its parser
  std::unordered_map<int64_t, Result<pipeline::SourceSample>> ready_;  // parsed, not yet due
  uint64_t ready_bytes_ = 0;
  std::unordered_map<int, Status> failed_;  // reads that ended early, and why
  std::unordered_set<int64_t> not_needed_;  // ids before the epoch's first position
  bool started_ = false;
  std::atomic<uint64_t> peak_held_{0};
  std::atomic<int64_t> skipped_{0};
};

// The number of samples in each shard, each read as a stream of ranged GETs of
// `range_bytes` and its headers parsed (several shards at once: `max_in_flight`, 0: 8).
// With options.skip_errors, bad samples are left out and added to `*skipped`.
Result<std::vector<int64_t>> CountSamples(Store& store, const std::vector<std::string>& keys,
                                          const TarParseOptions& options, int max_in_flight, int64_t* skipped,
                                          uint64_t range_bytes = ShardSourceOptions{}.range_bytes);

}  // namespace ddp::shards
