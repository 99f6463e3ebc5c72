#include "shards/source.h"

#include <algorithm>
#include <limits>
#include <thread>

namespace ddp::shards {

Result<std::shared_ptr<ShardSource>> ShardSource::Create(std::shared_ptr<Store> store, std::vector<std::string> keys,
                                                         std::vector<int64_t> counts, const ShardSourceOptions& options) {
  if (!store) return InvalidArgumentError("ShardSource: no store");
  if (keys.size() != counts.size()) {
    return InvalidArgumentError("ShardSource: " + std::to_string(keys.size()) + " shards but " +
                                std::to_string(counts.size()) + " sample counts");
  }
  if (keys.empty()) return InvalidArgumentError("ShardSource: no shards");
  if (options.range_bytes == 0) return InvalidArgumentError("ShardSource: range_bytes must be > 0");
  std::shared_ptr<ShardSource> s(new ShardSource());
  s->store_ = std::move(store);
  s->keys_ = std::move(keys);
  s->counts_ = std::move(counts);
  s->prefix_ = Prefix(s->counts_);
  s->opt_ = options;
  for (size_t i = 0; i < s->opt_.parse.fields.size(); ++i) {
    const std::string& f = s->opt_.parse.fields[i];
    if (s->image_field_ < 0 && (FieldOf({f}, "jpg") >= 0 || FieldOf({f}, "jpeg") >= 0 || FieldOf({f}, "png") >= 0)) {
      s->image_field_ = static_cast<int>(i);
    } else if (FieldOf({f}, "npy") >= 0) {
      s->kinds_.push_back(pipeline::FieldKind::kArray);
    } else if (FieldOf({f}, "cls") >= 0 || FieldOf({f}, "idx") >= 0) {
      s->kinds_.push_back(pipeline::FieldKind::kInt);
    } else {
      s->kinds_.push_back(pipeline::FieldKind::kBytes);
    }
  }
  // Validates the options (rank, world size, counts) once, up front.
  DDP_RETURN_IF_ERROR(s->Plan(0).status());
  return s;
}

ShardSource::~ShardSource() = default;

std::vector<std::string> ShardSource::field_names() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < opt_.parse.fields.size(); ++i) {
    if (static_cast<int>(i) != image_field_) out.push_back(opt_.parse.fields[i]);
  }
  return out;
}

Result<pipeline::SourceSample> ShardSource::ToSource(TarSample s, const std::string& url) const {
  pipeline::SourceSample out;
  out.label = s.label;
  out.url = url + "#" + s.key;
  if (opt_.parse.fields.empty()) {
    out.bytes = std::move(s.image);
    return out;
  }
  size_t k = 0;
  for (size_t i = 0; i < s.fields.size(); ++i) {
    if (static_cast<int>(i) == image_field_) {
      out.bytes = std::move(s.fields[i]);
      continue;
    }
    pipeline::SampleField f;
    f.kind = kinds_[k++];
    f.bytes = std::move(s.fields[i]);
    const std::string where = out.url + " member '" + opt_.parse.fields[i] + "'";
    if (f.kind == pipeline::FieldKind::kArray) {
      DDP_ASSIGN_OR_RETURN(NpyArray a, ParseNpy(f.bytes, where));
      f.dtype_kind = a.kind;
      f.itemsize = a.itemsize;
      f.shape = std::move(a.shape);
      f.data_offset = a.data_offset;
    } else if (f.kind == pipeline::FieldKind::kInt) {
      std::optional<int64_t> v = ParseIntText(f.bytes);
      if (!v) return InvalidArgumentError(where + ": not an integer");
      f.value = *v;
    }
    out.fields.push_back(std::move(f));
  }
  return out;
}

Status ShardSource::SetEpochSegments(uint64_t epoch, std::vector<Segment> segments) {
  DDP_RETURN_IF_ERROR(CheckSegments(counts_, segments));
  std::lock_guard<std::mutex> g(epoch_mu_);
  epoch_segments_[epoch] = std::move(segments);
  return Status::Ok();
}

Result<RankOrder> ShardSource::Plan(uint64_t epoch) const {
  // epoch_mu_ is held for the look-up only: a fork()ed child still counts an epoch
  // (len(), state_dict()), and finds it free unless the fork fell inside these lines.
  std::optional<std::vector<Segment>> set;
  {
    std::lock_guard<std::mutex> g(epoch_mu_);
    const auto it = epoch_segments_.find(epoch);
    if (it != epoch_segments_.end()) set = it->second;
  }
  const std::vector<Segment> segments =
      set ? std::move(*set) : EpochSegments(counts_, opt_.order.shuffle, opt_.order.seed, epoch);
  return RankSamples(counts_, segments, epoch, opt_.order);
}

int64_t ShardSource::NumSamples(uint64_t epoch) const {
  Result<RankOrder> r = Plan(epoch);
  return r.ok() ? static_cast<int64_t>(r->samples.size()) : 0;
}

Result<std::vector<int64_t>> ShardSource::Order(uint64_t epoch) {
  DDP_ASSIGN_OR_RETURN(RankOrder plan, Plan(epoch));
  order_ = std::move(plan.samples);
  prefetch_.reset();
  stream_.reset();
  ready_.clear();
  ready_bytes_ = 0;
  failed_.clear();
  not_needed_.clear();
  started_ = false;
  cur_ = 0;
  // Consecutive parts of one shard with increasing ranges are one stream.
  reads_.clear();
  starts_.clear();
  for (const Segment& g : plan.parts) {
    if (g.size() == 0) continue;
    if (reads_.empty() || reads_.back().shard != g.shard || reads_.back().ranges.back().end > g.begin) {
      reads_.push_back({g.shard, {}});
    }
    reads_.back().ranges.push_back(g);
    starts_.emplace_back(prefix_[static_cast<size_t>(g.shard)] + g.begin, static_cast<int>(reads_.size() - 1));
  }
  std::sort(starts_.begin(), starts_.end());
  return order_;
}

int ShardSource::ReadOf(int64_t id) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), std::make_pair(id, std::numeric_limits<int>::max()));
  if (it == starts_.begin()) return -1;
  return std::prev(it)->second;
}

void ShardSource::EndRead(Status why) {
  if (!why.ok()) failed_[static_cast<int>(cur_)] = std::move(why);
  if (stream_) skipped_ += stream_->skipped();
  stream_.reset();
  if (prefetch_) prefetch_->Release(cur_);
  ++cur_;
}

Result<bool> ShardSource::Advance(const std::atomic<bool>& cancel) {
  if (cur_ >= reads_.size()) return false;
  const Read& read = reads_[cur_];
  const std::string url = store_->KeyUrl(keys_[static_cast<size_t>(read.shard)]);
  if (!stream_) {
    stream_ = std::make_unique<TarStream>(url, opt_.parse);
    // Keep the bytes of samples in this read's ranges that are still due.
    const int64_t base = prefix_[static_cast<size_t>(read.shard)];
    stream_->SetKeep([this, &read, base](int64_t ordinal) {
      for (const Segment& g : read.ranges) {
        if (ordinal >= g.begin && ordinal < g.end) return !not_needed_.count(base + ordinal);
      }
      return false;
    });
  }
  Result<std::optional<TarSample>> r = stream_->Next();
  if (!r.ok()) {
    EndRead(r.status());
    return true;
  }
  if (*r) {
    TarSample& s = **r;
    const int64_t last = read.ranges.back().end;
    const bool wanted = std::any_of(read.ranges.begin(), read.ranges.end(),
                                    [&](const Segment& g) { return s.ordinal >= g.begin && s.ordinal < g.end; });
    const int64_t ordinal = s.ordinal;
    const int64_t id = prefix_[static_cast<size_t>(read.shard)] + ordinal;
    if (wanted && !not_needed_.count(id)) {
      Result<pipeline::SourceSample> out = ToSource(std::move(s), url);
      if (out.ok()) {
        ready_bytes_ += out->bytes.size();
        for (const auto& f : out->fields) ready_bytes_ += f.bytes.size();
      }
      ready_.insert_or_assign(id, std::move(out));
    }
    // A read ending inside its shard stops there; one reaching the shard's counted end
    // parses on to the end, so bad samples of its tail are counted as skipped.
    if (ordinal + 1 >= last && last < counts_[static_cast<size_t>(read.shard)]) EndRead(Status::Ok());
    return true;
  }
  if (stream_->done()) {
    const int64_t got = stream_->yielded();
    if (got >= read.ranges.back().end) {
      EndRead(Status::Ok());
      return true;
    }
    EndRead(DataLossError(url + ": has " + std::to_string(got) + " good samples, expected at least " +
                          std::to_string(read.ranges.back().end) + " (did the shard change since it was counted?)"));
    return true;
  }
  Result<std::optional<std::string>> chunk = prefetch_->Next(cur_, cancel);
  if (!chunk.ok()) {
    if (chunk.status().code() == Code::kCancelled) return chunk.status();
    EndRead(chunk.status());
    return true;
  }
  if (!*chunk) {
    stream_->Finish();
  } else {
    parsed_bytes_ += (*chunk)->size();
    stream_->Append(**chunk);
  }
  const uint64_t held = prefetch_->waiting_bytes() + stream_->buffered() + ready_bytes_;
  if (held > peak_held_.load()) peak_held_ = held;
  return true;
}

Status ShardSource::Fetch(std::span<const int64_t> positions, const pipeline::SampleCallback& cb,
                          const std::atomic<bool>& cancel) {
  if (!started_ && !positions.empty()) {
    // A resumed epoch starts at a later position: the samples before it are not kept.
    started_ = true;
    const int64_t first = std::clamp<int64_t>(positions.front(), 0, static_cast<int64_t>(order_.size()));
    for (int64_t p = 0; p < first; ++p) not_needed_.insert(order_[static_cast<size_t>(p)]);
    std::vector<std::string> keys;
    for (const Read& r : reads_) keys.push_back(keys_[static_cast<size_t>(r.shard)]);
    PrefetchOptions po;
    po.chunk_bytes = opt_.range_bytes;
    po.objects_ahead = opt_.lookahead_shards + 1;
    po.chunks_ahead = opt_.chunks_ahead;
    prefetch_ = std::make_unique<ChunkPrefetcher>(store_, std::move(keys), po);
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    const int64_t p = positions[i];
    if (p < 0 || p >= static_cast<int64_t>(order_.size())) {
      cb(i, OutOfRangeError("sample position " + std::to_string(p) + " is outside the epoch's " +
                            std::to_string(order_.size())));
      continue;
    }
    const int64_t id = order_[static_cast<size_t>(p)];
    const int read = ReadOf(id);
    // Parse on until the sample is here, or its read ended without it.
    while (!ready_.count(id) && read >= 0 && static_cast<size_t>(read) >= cur_) {
      Result<bool> more = Advance(cancel);
      if (!more.ok()) return more.status();  // cancelled: the Loader fails the rest
      if (!*more) break;
    }
    auto it = ready_.find(id);
    if (it != ready_.end()) {
      if (it->second.ok()) {
        ready_bytes_ -= it->second->bytes.size();
        for (const auto& f : it->second->fields) ready_bytes_ -= f.bytes.size();
      }
      Result<pipeline::SourceSample> s = std::move(it->second);
      ready_.erase(it);
      cb(i, std::move(s));
      continue;
    }
    const auto f = failed_.find(read);
    const int64_t shard = ShardOf(prefix_, id);
    cb(i, f != failed_.end() ? f->second
                             : DataLossError(store_->KeyUrl(keys_[static_cast<size_t>(shard)]) + ": sample " +
                                             std::to_string(id - prefix_[static_cast<size_t>(shard)]) +
                                             " is missing"));
  }
  return Status::Ok();
}

Result<std::vector<int64_t>> CountSamples(Store& store, const std::vector<std::string>& keys,
                                          const TarParseOptions& options, int max_in_flight, int64_t* skipped,
                                          uint64_t range_bytes) {
  if (range_bytes == 0) return InvalidArgumentError("range_bytes must be > 0");
  std::vector<int64_t> counts(keys.size(), -1);
  std::vector<Status> errors(keys.size());
  std::vector<int64_t> skips(keys.size(), 0);
  std::atomic<size_t> next{0};
  auto count_one = [&](size_t i) -> Status {
    const std::string url = store.KeyUrl(keys[i]);
    TarStream stream(url, options);
    stream.SetKeep([](int64_t) { return false; });
    bool finished = false;
    for (uint64_t offset = 0;;) {
      for (;;) {
        DDP_ASSIGN_OR_RETURN(std::optional<TarSample> s, stream.Next());
        if (!s) break;
      }
      if (stream.done()) break;
      if (finished) return InternalError(url + ": the tar parser stopped before the shard's end");
      Result<std::string> r = store.Get(keys[i], ByteRange{offset, range_bytes});
      const bool at_end = !r.ok() && r.status().code() == Code::kOutOfRange && offset > 0;
      if (!at_end) {
        DDP_RETURN_IF_ERROR(r.status());
        offset += r->size();
        stream.Append(*r);
      }
      finished = at_end || r->size() < range_bytes;
      if (finished) stream.Finish();
    }
    counts[i] = stream.yielded();
    skips[i] = stream.skipped();
    return Status::Ok();
  };
  const size_t threads = std::min<size_t>(keys.size(), static_cast<size_t>(max_in_flight > 0 ? max_in_flight : 8));
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < keys.size(); i = next++) errors[i] = count_one(i);
    });
  }
  for (auto& t : pool) t.join();
  for (size_t i = 0; i < keys.size(); ++i) {
    DDP_RETURN_IF_ERROR(errors[i]);
    if (skipped) *skipped += skips[i];
  }
  return counts;
}

}  // namespace ddp::shards
