#include "shards/source.h"

#include <algorithm>

namespace ddp::shards {

struct ShardSource::Loaded {
  std::string data;
  TarShard parsed;
  std::string url;
};

Result<std::string> GetInRanges(Store& store, const std::string& key, uint64_t range_bytes,
                                const std::atomic<bool>& cancel) {
  if (range_bytes == 0) return InvalidArgumentError("range_bytes must be > 0");
  DDP_ASSIGN_OR_RETURN(ObjectInfo info, store.Stat(key));
  std::string data;
  data.reserve(info.size);
  while (data.size() < info.size) {
    if (cancel) return CancelledError(store.KeyUrl(key) + ": cancelled");
    const uint64_t n = std::min<uint64_t>(range_bytes, info.size - data.size());
    DDP_ASSIGN_OR_RETURN(std::string piece, store.Get(key, ByteRange{data.size(), n}));
    if (piece.size() != n) {
      return DataLossError(store.KeyUrl(key) + ": range at byte " + std::to_string(data.size()) + " returned " +
                           std::to_string(piece.size()) + " of " + std::to_string(n) + " bytes");
    }
    data += piece;
  }
  return data;
}

Result<std::shared_ptr<ShardSource>> ShardSource::Create(std::shared_ptr<Store> store, std::vector<std::string> keys,
                                                         std::vector<int64_t> counts, const ShardSourceOptions& options) {
  if (!store) return InvalidArgumentError("ShardSource: no store");
  if (keys.size() != counts.size()) {
    return InvalidArgumentError("ShardSource: " + std::to_string(keys.size()) + " shards but " +
                                std::to_string(counts.size()) + " sample counts");
  }
  if (keys.empty()) return InvalidArgumentError("ShardSource: no shards");
  std::shared_ptr<ShardSource> s(new ShardSource());
  s->store_ = std::move(store);
  s->keys_ = std::move(keys);
  s->counts_ = std::move(counts);
  s->prefix_ = Prefix(s->counts_);
  s->opt_ = options;
  // Validates the options (rank, world size, counts) once, up front.
  DDP_RETURN_IF_ERROR(s->Plan(0).status());
  return s;
}

Status ShardSource::SetEpochSegments(uint64_t epoch, std::vector<Segment> segments) {
  DDP_RETURN_IF_ERROR(CheckSegments(counts_, segments));
  std::lock_guard<std::mutex> g(epoch_mu_);
  epoch_segments_[epoch] = std::move(segments);
  return Status::Ok();
}

Result<RankOrder> ShardSource::Plan(uint64_t epoch) const {
  std::unique_lock<std::mutex> g(epoch_mu_);
  const auto it = epoch_segments_.find(epoch);
  const std::vector<Segment> segments =
      it != epoch_segments_.end() ? it->second : EpochSegments(counts_, opt_.order.shuffle, opt_.order.seed, epoch);
  g.unlock();
  return RankSamples(counts_, segments, epoch, opt_.order);
}

int64_t ShardSource::NumSamples(uint64_t epoch) const {
  Result<RankOrder> r = Plan(epoch);
  return r.ok() ? static_cast<int64_t>(r->samples.size()) : 0;
}

Result<std::vector<int64_t>> ShardSource::Order(uint64_t epoch) {
  DDP_ASSIGN_OR_RETURN(RankOrder plan, Plan(epoch));
  order_ = std::move(plan.samples);
  uses_.clear();
  loaded_.clear();
  for (size_t p = 0; p < order_.size(); ++p) uses_[ShardOf(prefix_, order_[p])].push_back(static_cast<int64_t>(p));
  return order_;
}

Result<std::shared_ptr<ShardSource::Loaded>> ShardSource::Parse(int64_t shard, std::string data) {
  auto l = std::make_shared<Loaded>();
  l->data = std::move(data);
  l->url = store_->KeyUrl(keys_[static_cast<size_t>(shard)]);
  DDP_ASSIGN_OR_RETURN(l->parsed, ParseTar(l->data, l->url, opt_.parse));
  skipped_ += l->parsed.skipped;
  const auto want = counts_[static_cast<size_t>(shard)];
  const auto got = static_cast<int64_t>(l->parsed.samples.size());
  if (got != want && !opt_.parse.skip_errors) {
    return DataLossError(l->url + ": has " + std::to_string(got) + " samples, expected " + std::to_string(want) +
                         " (did the shard change since it was counted?)");
  }
  return l;
}

void ShardSource::Deliver(int64_t position, size_t index, const pipeline::SampleCallback& cb) {
  const int64_t id = order_[static_cast<size_t>(position)];
  const int64_t shard = ShardOf(prefix_, id);
  const Loaded& l = *loaded_.at(shard);
  const auto ordinal = static_cast<size_t>(id - prefix_[static_cast<size_t>(shard)]);
  if (ordinal >= l.parsed.samples.size()) {
    cb(index, DataLossError(l.url + ": sample " + std::to_string(ordinal) + " is missing (the shard has " +
                            std::to_string(l.parsed.samples.size()) + " good samples)"));
    return;
  }
  const TarSample& s = l.parsed.samples[ordinal];
  pipeline::SourceSample out;
  out.bytes.assign(l.data, s.image_offset, s.image_size);
  out.label = s.label;
  out.url = l.url + "#" + s.key;
  cb(index, std::move(out));
}

Status ShardSource::Fetch(std::span<const int64_t> positions, const pipeline::SampleCallback& cb,
                          const std::atomic<bool>& cancel) {
  std::map<int64_t, std::vector<size_t>> pending;  // shard -> indices into positions
  for (size_t i = 0; i < positions.size(); ++i) {
    const int64_t p = positions[i];
    if (p < 0 || p >= static_cast<int64_t>(order_.size())) {
      cb(i, OutOfRangeError("sample position " + std::to_string(p) + " is outside the epoch's " +
                            std::to_string(order_.size())));
      continue;
    }
    const int64_t shard = ShardOf(prefix_, order_[static_cast<size_t>(p)]);
    if (loaded_.count(shard)) {
      Deliver(p, i, cb);
    } else {
      pending[shard].push_back(i);
    }
  }
  if (positions.empty()) return Status::Ok();
  const int64_t last = positions.back();
  const int64_t max_count = *std::max_element(counts_.begin(), counts_.end());
  const int64_t window = std::max<int64_t>(opt_.order.shuffle_buffer, 1) + max_count;
  std::vector<int64_t> wanted;
  for (const auto& [shard, idx] : pending) wanted.push_back(shard);
  // The next shards due, fetched now so they are in memory when needed.
  int extra = 0;
  for (int64_t p = last + 1; p < static_cast<int64_t>(order_.size()) && p <= last + window &&
                             extra < opt_.lookahead_shards;
       ++p) {
    const int64_t shard = ShardOf(prefix_, order_[static_cast<size_t>(p)]);
    if (loaded_.count(shard) || std::find(wanted.begin(), wanted.end(), shard) != wanted.end()) continue;
    wanted.push_back(shard);
    ++extra;
  }
  Status st = Status::Ok();
  if (!wanted.empty()) {
    std::vector<std::string> keys;
    for (int64_t s : wanted) keys.push_back(keys_[static_cast<size_t>(s)]);
    std::vector<bool> done(wanted.size(), false);
    std::vector<size_t> oversized;  // read in ranges once GetMany is done
    auto fail = [&](int64_t shard, const Status& why) {
      auto it = pending.find(shard);
      if (it == pending.end()) return;
      for (size_t i : it->second) cb(i, why);
      pending.erase(it);
    };
    // A shard's bytes (or failure): parsed, kept, and its pending samples delivered.
    auto arrived = [&](int64_t shard, Result<std::string> r) {
      if (!r.ok()) return fail(shard, r.status());
      Result<std::shared_ptr<Loaded>> l = Parse(shard, std::move(r).value());
      if (!l.ok()) return fail(shard, l.status());
      loaded_[shard] = std::move(l).value();
      auto it = pending.find(shard);
      if (it == pending.end()) return;
      for (size_t i : it->second) Deliver(positions[i], i, cb);
      pending.erase(it);
    };
    st = store_->GetManyCancellable(
        keys,
        [&](size_t k, Result<std::string> r) {
          if (k >= wanted.size() || done[k]) return;
          done[k] = true;
          if (!r.ok() && r.status().code() == Code::kResourceExhausted) {
            oversized.push_back(k);
            return;
          }
          arrived(wanted[k], std::move(r));
        },
        opt_.max_in_flight, cancel);
    for (size_t k : oversized) {
      if (!st.ok()) break;
      arrived(wanted[k], GetInRanges(*store_, keys[k], opt_.range_bytes, cancel));
    }
    const Status why = st.ok() ? InternalError("GetMany returned without a shard") : st;
    while (!pending.empty()) fail(pending.begin()->first, why);
  }
  // Keep only the shards due again soon.
  for (auto it = loaded_.begin(); it != loaded_.end();) {
    const std::vector<int64_t>& u = uses_[it->first];
    const auto next = std::upper_bound(u.begin(), u.end(), last);
    if (next == u.end() || *next - last > window) {
      it = loaded_.erase(it);
    } else {
      ++it;
    }
  }
  return st.code() == Code::kCancelled ? st : Status::Ok();
}

Result<std::vector<int64_t>> CountSamples(Store& store, const std::vector<std::string>& keys,
                                          const TarParseOptions& options, int max_in_flight, int64_t* skipped,
                                          uint64_t range_bytes) {
  std::vector<int64_t> counts(keys.size(), -1);
  Status first = Status::Ok();
  std::mutex mu;
  std::vector<size_t> oversized;  // read in ranges once GetMany is done
  auto count = [&](size_t i, Result<std::string> r) {
    Result<TarShard> parsed = r.ok() ? ParseTar(*r, store.KeyUrl(keys[i]), options) : Result<TarShard>(r.status());
    std::lock_guard<std::mutex> g(mu);
    if (!parsed.ok()) {
      if (first.ok()) first = parsed.status();
      return;
    }
    counts[i] = static_cast<int64_t>(parsed->samples.size());
    if (skipped) *skipped += parsed->skipped;
  };
  Status st = store.GetMany(
      keys,
      [&](size_t i, Result<std::string> r) {
        if (i >= keys.size()) return;
        if (!r.ok() && r.status().code() == Code::kResourceExhausted) {
          std::lock_guard<std::mutex> g(mu);
          oversized.push_back(i);
          return;
        }
        count(i, std::move(r));
      },
      max_in_flight);
  DDP_RETURN_IF_ERROR(st);
  const std::atomic<bool> never{false};
  for (size_t i : oversized) count(i, GetInRanges(store, keys[i], range_bytes, never));
  DDP_RETURN_IF_ERROR(first);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (counts[i] < 0) return InternalError(store.KeyUrl(keys[i]) + ": GetMany returned without it");
  }
  return counts;
}

}  // namespace ddp::shards
