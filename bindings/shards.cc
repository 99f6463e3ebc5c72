// Bindings of WebDataset tar shards: dask_ddp._core.TarShardLoader (the ImageLoader over
// shards), and the dataset's bookkeeping: tar_shard_counts (samples per shard),
// shard_rank_order (a rank's samples of an epoch) and shard_unread_segments (what no rank
// had read at a position, to resume from).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "convert.h"
#include "errors.h"
#include "loader.h"
#include "shards/source.h"
#include "storage.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ddp::py {
namespace {

// A segment of a shard as Python sees it: (shard, begin, end).
using PySegment = std::tuple<int64_t, int64_t, int64_t>;

std::vector<shards::Segment> ToSegments(const std::vector<PySegment>& in) {
  std::vector<shards::Segment> out;
  out.reserve(in.size());
  for (const auto& [s, b, e] : in) out.push_back({s, b, e});
  return out;
}

std::vector<PySegment> FromSegments(const std::vector<shards::Segment>& in) {
  std::vector<PySegment> out;
  out.reserve(in.size());
  for (const shards::Segment& g : in) out.emplace_back(g.shard, g.begin, g.end);
  return out;
}

// Options of the TarShardLoader binding beyond the ImageLoader's.
struct PyShardArgs {
  int64_t shuffle_buffer = 1000;
  std::string label_field;
  int lookahead_shards = 2;
  uint64_t range_bytes = shards::ShardSourceOptions{}.range_bytes;
  std::vector<std::string> fields;
};

// The pipeline of a loader that decodes no images: never run (one pixel per sample).
image::Pipeline NoImagePipeline() { return MakePipeline({{"resize", {1, 1, 0}}, {"pil_to_tensor", {}}}).value(); }

// A loader over tar shards; set_epoch_segments reaches its source.
class PyShardLoader : public PyLoader {
 public:
  PyShardLoader(const PyStore& store, std::vector<std::string> keys, std::vector<int64_t> counts,
                const std::vector<OpSpec>& ops, const PyLoaderArgs& a, const PyShardArgs& sa) {
    pipeline::LoaderOptions o = MakeLoaderOptions(a);
    shards::ShardSourceOptions so;
    so.order = {a.shuffle, a.seed, a.rank, a.world_size, a.drop_last, sa.shuffle_buffer};
    so.parse = {a.skip_errors, sa.label_field, sa.fields};
    so.lookahead_shards = sa.lookahead_shards;
    so.range_bytes = sa.range_bytes;
    so.max_in_flight = a.max_in_flight;
    {
      nb::gil_scoped_release release;
      source_ = ValueOrThrow(shards::ShardSource::Create(store.store, std::move(keys), std::move(counts), so));
    }
    fields_ = !sa.fields.empty();
    decode_images_ = source_->has_images();
    o.decode_images = decode_images_;
    o.field_names = source_->field_names();
    image::Pipeline pipeline = decode_images_ ? ValueOrThrow(MakePipeline(ops)) : NoImagePipeline();
    nb::gil_scoped_release release;
    loader_ = ValueOrThrow(pipeline::Loader::Create(source_, std::move(pipeline), o));
  }

  int64_t EpochSamples(uint64_t epoch) {
    checked();
    return source_->NumSamples(epoch);
  }

  void SetEpochSegments(uint64_t epoch, const std::vector<PySegment>& segments) {
    checked();
    ThrowIfError(source_->SetEpochSegments(epoch, ToSegments(segments)));
  }

 private:
  std::shared_ptr<shards::ShardSource> source_;
};

void InitShardLoader(PyShardLoader* self, const PyStore& store, std::vector<std::string> keys,
                     std::vector<int64_t> counts, const std::vector<OpSpec>& ops, int batch_size, bool shuffle,
                     uint64_t seed, int rank, int world_size, bool drop_last, int num_threads, int prefetch,
                     bool skip_errors, int max_side, bool scaled_decode, bool region_decode, int max_in_flight,
                     int64_t shuffle_buffer, std::string label_field, int lookahead_shards, uint64_t range_bytes,
                     std::vector<std::string> fields) {
  PyLoaderArgs a;
  a.batch_size = batch_size;
  a.shuffle = shuffle;
  a.seed = seed;
  a.rank = rank;
  a.world_size = world_size;
  a.drop_last = drop_last;
  a.num_threads = num_threads;
  a.prefetch = prefetch;
  a.skip_errors = skip_errors;
  a.max_side = max_side;
  a.scaled_decode = scaled_decode;
  a.region_decode = region_decode;
  a.max_in_flight = max_in_flight;
  new (self) PyShardLoader(
      store, std::move(keys), std::move(counts), ops, a,
      PyShardArgs{shuffle_buffer, std::move(label_field), lookahead_shards, range_bytes, std::move(fields)});
}

nb::tuple TarShardCounts(const PyStore& store, const std::vector<std::string>& keys, bool skip_errors,
                         const std::string& label_field, int max_in_flight, uint64_t range_bytes,
                         const std::vector<std::string>& fields) {
  int64_t skipped = 0;
  Result<std::vector<int64_t>> r = [&] {
    nb::gil_scoped_release release;
    return shards::CountSamples(*store.store, keys, {skip_errors, label_field, fields}, max_in_flight, &skipped,
                                range_bytes);
  }();
  return nb::make_tuple(ValueOrThrow(std::move(r)), skipped);
}

nb::tuple ShardRankOrder(const std::vector<int64_t>& counts, std::optional<std::vector<PySegment>> segments,
                         uint64_t epoch, int rank, int world_size, bool shuffle, uint64_t seed, bool drop_last,
                         int64_t shuffle_buffer) {
  const shards::ShardOrderOptions o{shuffle, seed, rank, world_size, drop_last, shuffle_buffer};
  const std::vector<shards::Segment> list =
      segments ? ToSegments(*segments) : shards::EpochSegments(counts, shuffle, seed, epoch);
  shards::RankOrder r = ValueOrThrow(shards::RankSamples(counts, list, epoch, o));
  return nb::make_tuple(r.samples, FromSegments(r.parts), FromSegments(list));
}

std::vector<PySegment> ShardUnreadSegments(const std::vector<int64_t>& counts,
                                           std::optional<std::vector<PySegment>> segments, uint64_t epoch,
                                           int64_t position, int world_size, bool shuffle, uint64_t seed,
                                           bool drop_last, int64_t shuffle_buffer) {
  const shards::ShardOrderOptions o{shuffle, seed, 0, world_size, drop_last, shuffle_buffer};
  const std::vector<shards::Segment> list =
      segments ? ToSegments(*segments) : shards::EpochSegments(counts, shuffle, seed, epoch);
  return FromSegments(ValueOrThrow(shards::UnreadSegments(counts, list, epoch, o, position)));
}

void DefShardLoader(nb::module_& m) {
  const PyLoaderArgs d;
  const PyShardArgs sd;
  nb::class_<PyShardLoader, PyLoader>(m, "TarShardLoader",
                                      "The C++ batch loader over tar shards (use dask_ddp.data.Loader).")
      .def("__init__", &InitShardLoader, "store"_a, "keys"_a, "counts"_a, "ops"_a, nb::kw_only(),
           "batch_size"_a = d.batch_size, "shuffle"_a = d.shuffle, "seed"_a = d.seed, "rank"_a = d.rank,
           "world_size"_a = d.world_size, "drop_last"_a = d.drop_last, "num_threads"_a = d.num_threads,
           "prefetch"_a = d.prefetch, "skip_errors"_a = d.skip_errors, "max_side"_a = d.max_side,
           "scaled_decode"_a = d.scaled_decode, "region_decode"_a = d.region_decode,
           "max_in_flight"_a = d.max_in_flight, "shuffle_buffer"_a = sd.shuffle_buffer,
           "label_field"_a = sd.label_field, "lookahead_shards"_a = sd.lookahead_shards,
           "range_bytes"_a = sd.range_bytes, "fields"_a = sd.fields,
           "A loader reading the tar shards `keys` of `store` (counts[i] samples in keys[i]) "
           "in the order of shard_rank_order, as ImageLoader does objects.\n\n"
           "shuffle_buffer: samples mixed within a rank. label_field: the integer field of each "
           "sample's .json member holding its label (empty: the .cls member). Shards stream as "
           "ranged GETs of range_bytes, parsed as they arrive: the current shard and "
           "lookahead_shards more read at once, two ranges ahead each. fields: the members that "
           "make a sample, by extension ('jpg;png' alternatives); then next() returns (images or "
           "None, labels, index, [the other fields: .npy stacked into one tensor, .cls/.idx an "
           "int64 tensor, else a list of bytes]). skip_errors also leaves out bad tar members "
           "and samples without an image. Other arguments as ImageLoader.")
      .def("set_epoch_segments", &PyShardLoader::SetEpochSegments, "epoch"_a, "segments"_a,
           "For `epoch` only, read these (shard, begin, end) sample ranges instead of every "
           "shard whole.")
      .def("epoch_samples", &PyShardLoader::EpochSamples, "epoch"_a,
           "Samples this rank yields in `epoch` (the same on every rank; padding included).");
}

void DefShardOrder(nb::module_& m) {
  const PyShardArgs sd;
  m.def("tar_shard_counts", &TarShardCounts, "store"_a, "keys"_a, "skip_errors"_a = false, "label_field"_a = "",
        "max_in_flight"_a = 0, "range_bytes"_a = sd.range_bytes, "fields"_a = std::vector<std::string>{},
        "(samples per shard, samples skipped): each shard streamed as ranged GETs of "
        "range_bytes and its tar headers parsed, max_in_flight shards at once (0: 8); with "
        "`fields`, a sample is good when it has every one of them.");
  m.def("shard_rank_order", &ShardRankOrder, "counts"_a, "segments"_a.none(), "epoch"_a, "rank"_a,
        "world_size"_a, "shuffle"_a = true, "seed"_a = 0, "drop_last"_a = false,
        "shuffle_buffer"_a = sd.shuffle_buffer,
        "(sample ids in order, this rank's (shard, begin, end) parts in reading order, the epoch's "
        "segments) for a rank of a sharded dataset: `segments` the epoch's (shard, begin, end) "
        "list (None: every shard whole, shuffled by (seed, epoch)).");
  m.def("shard_unread_segments", &ShardUnreadSegments, "counts"_a, "segments"_a.none(), "epoch"_a, "position"_a,
        "world_size"_a, "shuffle"_a = true, "seed"_a = 0, "drop_last"_a = false,
        "shuffle_buffer"_a = sd.shuffle_buffer,
        "The (shard, begin, end) runs of samples no rank of `world_size` had yielded once each "
        "yielded `position` samples of `epoch`, in the epoch's order.");
}

}  // namespace

void init_shards(nb::module_& m) {
  DefShardLoader(m);
  DefShardOrder(m);
}

}  // namespace ddp::py
