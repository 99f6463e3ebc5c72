// Bindings of the image pipeline: dask_ddp._core.ImageLoader (the threaded batch loader)
// and TarShardLoader (the same over WebDataset tar shards, with tar_shard_counts and
// shard_rank_order for the dataset's bookkeeping),
// decode_image / transform_image (one image, for tests and tools), rrc_box (torchvision's
// RandomResizedCrop parameters from given draws) and decode_throughput (the benchmark's
// decode-only ceiling).
//
// Batches cross to Python as torch tensors through DLPack without a copy: the tensor's
// owner is a capsule holding the batch buffer's lease, so the engine reuses the buffer
// only after torch frees the tensor.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <thread>

#include "ddp/store.h"
#include "errors.h"
#include "storage.h"
#include "image/decode.h"
#include "image/transforms.h"
#include "pipeline/loader.h"
#include "pipeline/throughput.h"
#include "shards/source.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ddp::py {
namespace {

using OpSpec = std::pair<std::string, std::vector<double>>;
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

Status NeedParams(const OpSpec& s, size_t n) {
  if (s.second.size() != n) {
    return InvalidArgumentError("transform op '" + s.first + "' takes " + std::to_string(n) +
                                " parameters, got " + std::to_string(s.second.size()));
  }
  return Status::Ok();
}

// Ops as (name, parameters), made by dask_ddp.data.transforms (see each class's _op()).
Result<image::Pipeline> MakePipeline(const std::vector<OpSpec>& specs, bool fixed_size = true) {
  std::vector<image::TransformOp> ops;
  for (const OpSpec& s : specs) {
    image::TransformOp op;
    const std::vector<double>& p = s.second;
    if (s.first == "resize") {
      DDP_RETURN_IF_ERROR(NeedParams(s, 3));
      op.kind = image::OpKind::kResize;
      op.height = static_cast<int>(p[0]);
      op.width = static_cast<int>(p[1]);
      op.antialias = p[2] != 0;
    } else if (s.first == "center_crop") {
      DDP_RETURN_IF_ERROR(NeedParams(s, 2));
      op.kind = image::OpKind::kCenterCrop;
      op.height = static_cast<int>(p[0]);
      op.width = static_cast<int>(p[1]);
    } else if (s.first == "random_resized_crop") {
      DDP_RETURN_IF_ERROR(NeedParams(s, 7));
      op.kind = image::OpKind::kRandomResizedCrop;
      op.height = static_cast<int>(p[0]);
      op.width = static_cast<int>(p[1]);
      op.scale = {p[2], p[3]};
      op.ratio = {p[4], p[5]};
      op.antialias = p[6] != 0;
    } else if (s.first == "hflip") {
      DDP_RETURN_IF_ERROR(NeedParams(s, 1));
      op.kind = image::OpKind::kHorizontalFlip;
      op.p = p[0];
    } else if (s.first == "to_tensor") {
      DDP_RETURN_IF_ERROR(NeedParams(s, 0));
      op.kind = image::OpKind::kToTensor;
    } else if (s.first == "pil_to_tensor") {
      DDP_RETURN_IF_ERROR(NeedParams(s, 0));
      op.kind = image::OpKind::kPILToTensor;
    } else if (s.first == "normalize") {
      DDP_RETURN_IF_ERROR(NeedParams(s, 6));
      op.kind = image::OpKind::kNormalize;
      op.mean = {p[0], p[1], p[2]};
      op.std = {p[3], p[4], p[5]};
    } else {
      return InvalidArgumentError("unknown transform op '" + s.first + "'");
    }
    ops.push_back(op);
  }
  return image::Pipeline::Create(std::move(ops), fixed_size);
}

// A capsule owning a heap copy of `value`; deleting the capsule destroys it.
template <typename T>
nb::capsule OwnerOf(T value) {
  return nb::capsule(new T(std::move(value)), [](void* p) noexcept { delete static_cast<T*>(p); });
}

nb::object ImagesTensor(void* data, size_t n, const image::Pipeline& p, nb::handle owner) {
  const size_t shape[4] = {n, 3, static_cast<size_t>(p.out_height()), static_cast<size_t>(p.out_width())};
  const nb::dlpack::dtype dt = p.float_output() ? nb::dtype<float>() : nb::dtype<uint8_t>();
  return nb::ndarray<nb::pytorch>(data, 4, shape, owner, nullptr, dt).cast();
}

std::string_view View(const nb::bytes& b) { return {b.c_str(), b.size()}; }

// A batch's field as Python takes it: arrays as one tensor (n, *shape) owning the stacked
// data, integers as an int64 tensor, anything else as a list of bytes.
nb::object FieldObject(pipeline::FieldColumn& c, size_t n) {
  if (c.kind == pipeline::FieldKind::kBytes) {
    nb::list out;
    for (const std::string& r : c.raw) out.append(nb::bytes(r.data(), r.size()));
    return out;
  }
  if (c.kind == pipeline::FieldKind::kInt) {
    auto v = std::make_shared<std::vector<int64_t>>(std::move(c.ints));
    const size_t shape[1] = {v->size()};
    int64_t* p = v->data();
    return nb::ndarray<nb::pytorch, int64_t>(p, 1, shape, OwnerOf(std::move(v))).cast();
  }
  std::vector<size_t> shape = {n};
  for (int64_t d : c.shape) shape.push_back(static_cast<size_t>(d));
  nb::dlpack::dtype dt;
  dt.code = static_cast<uint8_t>(c.dtype_kind == 'b'   ? nb::dlpack::dtype_code::Bool
                                 : c.dtype_kind == 'i' ? nb::dlpack::dtype_code::Int
                                 : c.dtype_kind == 'u' ? nb::dlpack::dtype_code::UInt
                                                       : nb::dlpack::dtype_code::Float);
  dt.bits = static_cast<uint8_t>(c.itemsize * 8);
  dt.lanes = 1;
  uint8_t* p = c.data->data();
  return nb::ndarray<nb::pytorch>(p, shape.size(), shape.data(), OwnerOf(c.data), nullptr, dt).cast();
}

// Options of the ImageLoader binding, as keyword-only arguments with these defaults.
struct PyLoaderArgs {
  int batch_size = 64;
  bool shuffle = true;
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  bool drop_last = false;
  int num_threads = 0;
  int prefetch = 4;
  bool skip_errors = false;
  bool skip_missing = false;
  int max_side = image::DecodeOptions{}.max_side;
  bool scaled_decode = true;
  bool region_decode = true;
  int max_in_flight = 0;
};

// The binding's handle on a Loader. The Loader is shared: next() holds its own reference
// while it waits with the GIL released, so close() from another thread stops it (next()
// then raises "closed") and the last holder destroys it, never one under the other.
pipeline::LoaderOptions MakeLoaderOptions(const PyLoaderArgs& a) {
  pipeline::LoaderOptions o;
  o.batch_size = a.batch_size;
  o.num_threads = a.num_threads;
  o.prefetch = a.prefetch;
  o.drop_last = a.drop_last;
  o.skip_errors = a.skip_errors;
  o.skip_missing = a.skip_missing;
  o.scaled_decode = a.scaled_decode;
  o.region_decode = a.region_decode;
  o.max_in_flight = a.max_in_flight;
  o.sampler = {a.shuffle, a.seed, a.rank, a.world_size, a.drop_last};
  o.decode.max_side = a.max_side;
  return o;
}

class PyLoader {
 public:
  PyLoader(const PyStore& store, std::vector<std::string> keys, std::vector<int64_t> labels,
           const std::vector<OpSpec>& ops, const PyLoaderArgs& a) {
    image::Pipeline pipeline = ValueOrThrow(MakePipeline(ops));
    pipeline::LoaderOptions o = MakeLoaderOptions(a);
    // Local files: each worker reads its own file (parallel reads, no extra thread).
    // Remote stores: one fetch thread keeps many requests in flight with GetMany.
    Result<StoreUrl> where = ParseStoreUrl(store.store->url());
    o.batched_fetch = !(where.ok() && where->local);
    nb::gil_scoped_release release;
    loader_ = ValueOrThrow(pipeline::Loader::Create(store.store, std::move(keys), std::move(labels),
                                                    std::move(pipeline), o));
  }

  void StartEpoch(uint64_t epoch, int64_t start_batch) {
    std::shared_ptr<pipeline::Loader> loader = checked();
    Status st;
    {
      nb::gil_scoped_release release;
      st = loader->StartEpoch(epoch, start_batch);
      loader.reset();  // the last reference may join threads: not under the GIL
    }
    ThrowIfError(st);
  }

  nb::object Next() {
    std::shared_ptr<pipeline::Loader> loader = checked();
    Result<std::optional<pipeline::Batch>> r = [&] {
      nb::gil_scoped_release release;
      return loader->Next();
    }();
    std::optional<pipeline::Batch> b = ValueOrThrow(std::move(r));
    if (!b) return nb::none();
    const size_t n = static_cast<size_t>(b->size);
    nb::object images = decode_images_ ? ImagesTensor(b->images, n, loader->pipeline(), OwnerOf(b->lease)) : nb::none();
    const size_t lshape[1] = {n};
    nb::object labels = nb::ndarray<nb::pytorch, int64_t>(b->labels, 1, lshape, OwnerOf(b->lease)).cast();
    {
      nb::gil_scoped_release release;
      loader.reset();
    }
    if (!fields_) return nb::make_tuple(images, labels, b->index);
    nb::list fields;
    for (pipeline::FieldColumn& c : b->fields) fields.append(FieldObject(c, n));
    return nb::make_tuple(images, labels, b->index, fields);
  }

  void Close() {
    std::shared_ptr<pipeline::Loader> loader = std::move(loader_);  // under the GIL
    if (!loader) return;
    nb::gil_scoped_release release;
    loader->Shutdown();
    loader.reset();
  }

  std::shared_ptr<pipeline::Loader> checked() const {
    if (!loader_) throw nb::value_error("the loader is closed");
    return loader_;
  }

 protected:
  PyLoader() = default;
  std::shared_ptr<pipeline::Loader> loader_;
  bool decode_images_ = true;
  bool fields_ = false;  // next() also returns the batch's fields
};

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

// A loader over tar shards; set_epoch_shards reaches its source.
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

void init_shards(nb::module_& m, const PyLoaderArgs& defaults) {
  const PyShardArgs sd;
  nb::class_<PyShardLoader, PyLoader>(m, "TarShardLoader",
                                      "The C++ batch loader over tar shards (use dask_ddp.data.Loader).")
      .def(
          "__init__",
          [](PyShardLoader* self, const PyStore& store, std::vector<std::string> keys, std::vector<int64_t> counts,
             const std::vector<OpSpec>& ops, int batch_size, bool shuffle, uint64_t seed, int rank,
             int world_size, bool drop_last, int num_threads, int prefetch, bool skip_errors, int max_side,
             bool scaled_decode, bool region_decode, int max_in_flight, int64_t shuffle_buffer,
             std::string label_field, int lookahead_shards, uint64_t range_bytes, std::vector<std::string> fields) {
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
            new (self) PyShardLoader(store, std::move(keys), std::move(counts), ops, a,
                                     PyShardArgs{shuffle_buffer, std::move(label_field), lookahead_shards,
                                                 range_bytes, std::move(fields)});
          },
          "store"_a, "keys"_a, "counts"_a, "ops"_a, nb::kw_only(), "batch_size"_a = defaults.batch_size,
          "shuffle"_a = defaults.shuffle, "seed"_a = defaults.seed, "rank"_a = defaults.rank,
          "world_size"_a = defaults.world_size, "drop_last"_a = defaults.drop_last,
          "num_threads"_a = defaults.num_threads, "prefetch"_a = defaults.prefetch,
          "skip_errors"_a = defaults.skip_errors, "max_side"_a = defaults.max_side,
          "scaled_decode"_a = defaults.scaled_decode, "region_decode"_a = defaults.region_decode,
          "max_in_flight"_a = defaults.max_in_flight, "shuffle_buffer"_a = sd.shuffle_buffer,
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

  m.def(
      "tar_shard_counts",
      [](const PyStore& store, const std::vector<std::string>& keys, bool skip_errors,
         const std::string& label_field, int max_in_flight, uint64_t range_bytes,
         const std::vector<std::string>& fields) {
        int64_t skipped = 0;
        Result<std::vector<int64_t>> r = [&] {
          nb::gil_scoped_release release;
          return shards::CountSamples(*store.store, keys, {skip_errors, label_field, fields}, max_in_flight, &skipped,
                                      range_bytes);
        }();
        return nb::make_tuple(ValueOrThrow(std::move(r)), skipped);
      },
      "store"_a, "keys"_a, "skip_errors"_a = false, "label_field"_a = "", "max_in_flight"_a = 0,
      "range_bytes"_a = PyShardArgs{}.range_bytes, "fields"_a = std::vector<std::string>{},
      "(samples per shard, samples skipped): each shard streamed as ranged GETs of "
      "range_bytes and its tar headers parsed, max_in_flight shards at once (0: 8); with "
      "`fields`, a sample is good when it has every one of them.");

  m.def(
      "shard_rank_order",
      [](const std::vector<int64_t>& counts, std::optional<std::vector<PySegment>> segments, uint64_t epoch,
         int rank, int world_size, bool shuffle, uint64_t seed, bool drop_last, int64_t shuffle_buffer) {
        const shards::ShardOrderOptions o{shuffle, seed, rank, world_size, drop_last, shuffle_buffer};
        const std::vector<shards::Segment> list =
            segments ? ToSegments(*segments) : shards::EpochSegments(counts, shuffle, seed, epoch);
        shards::RankOrder r = ValueOrThrow(shards::RankSamples(counts, list, epoch, o));
        return nb::make_tuple(r.samples, FromSegments(r.parts), FromSegments(list));
      },
      "counts"_a, "segments"_a.none(), "epoch"_a, "rank"_a, "world_size"_a, "shuffle"_a = true, "seed"_a = 0,
      "drop_last"_a = false, "shuffle_buffer"_a = PyShardArgs{}.shuffle_buffer,
      "(sample ids in order, this rank's (shard, begin, end) parts in reading order, the epoch's "
      "segments) for a rank of a sharded dataset: `segments` the epoch's (shard, begin, end) "
      "list (None: every shard whole, shuffled by (seed, epoch)).");

  m.def(
      "shard_unread_segments",
      [](const std::vector<int64_t>& counts, std::optional<std::vector<PySegment>> segments, uint64_t epoch,
         int64_t position, int world_size, bool shuffle, uint64_t seed, bool drop_last, int64_t shuffle_buffer) {
        const shards::ShardOrderOptions o{shuffle, seed, 0, world_size, drop_last, shuffle_buffer};
        const std::vector<shards::Segment> list =
            segments ? ToSegments(*segments) : shards::EpochSegments(counts, shuffle, seed, epoch);
        return FromSegments(ValueOrThrow(shards::UnreadSegments(counts, list, epoch, o, position)));
      },
      "counts"_a, "segments"_a.none(), "epoch"_a, "position"_a, "world_size"_a, "shuffle"_a = true,
      "seed"_a = 0, "drop_last"_a = false, "shuffle_buffer"_a = PyShardArgs{}.shuffle_buffer,
      "The (shard, begin, end) runs of samples no rank of `world_size` had yielded once each "
      "yielded `position` samples of `epoch`, in the epoch's order.");
}

}  // namespace

void init_data(nb::module_& m) {
  const image::DecodeOptions dd;

  m.def(
      "decode_image",
      [](nb::bytes data, const std::string& url, int max_side, int scale_denom) {
        image::DecodeOptions o;
        o.max_side = max_side;
        image::Image img;
        Status st;
        {
          nb::gil_scoped_release release;
          st = image::DecodeImage(View(data), url, o, scale_denom, img);
        }
        ThrowIfError(st);
        const size_t shape[3] = {static_cast<size_t>(img.height), static_cast<size_t>(img.width), 3};
        uint8_t* px = img.pixels.data();
        return nb::ndarray<nb::numpy, uint8_t>(px, 3, shape, OwnerOf(std::move(img.pixels))).cast();
      },
      "data"_a, "url"_a = "", "max_side"_a = dd.max_side, "scale_denom"_a = 1,
      "Decode JPEG or PNG bytes to an RGB uint8 array (H, W, 3). `url` names the data in errors.");

  m.def(
      "image_info",
      [](nb::bytes data, const std::string& url, int max_side) {
        image::DecodeOptions o;
        o.max_side = max_side;
        image::ImageInfo info = ValueOrThrow(image::ReadImageInfo(View(data), url, o));
        return nb::make_tuple(info.width, info.height, info.format == image::Format::kJpeg ? "jpeg" : "png");
      },
      "data"_a, "url"_a = "", "max_side"_a = dd.max_side, "(width, height, format) from the header.");

  m.def(
      "transform_image",
      [](nb::bytes data, const std::vector<OpSpec>& ops, uint64_t seed, uint64_t epoch, uint64_t index,
         bool scaled_decode, bool region_decode, const std::string& url) {
        image::Pipeline p = ValueOrThrow(MakePipeline(ops, /*fixed_size=*/false));
        std::vector<uint8_t> out;
        std::array<int, 2> hw{0, 0};
        Status st;
        {
          nb::gil_scoped_release release;
          st = [&]() -> Status {
            DDP_ASSIGN_OR_RETURN(image::ImageInfo info, image::ReadImageInfo(View(data), url));
            hw = p.OutputSize(info.width, info.height);
            out.resize(p.sample_bytes(hw[0], hw[1]));
            image::Rng rng = image::Rng::ForSample(seed, epoch, index);
            const bool jpeg = info.format == image::Format::kJpeg;
            image::SamplePlan plan =
                p.Plan(info.width, info.height, rng, scaled_decode && jpeg, region_decode && jpeg);
            image::Image img;
            DDP_RETURN_IF_ERROR(image::DecodeImage(View(data), url, {}, plan.scale_denom, img,
                                                   plan.region ? &*plan.region : nullptr));
            return p.Apply(img, plan, out.data());
          }();
        }
        ThrowIfError(st);
        const size_t shape[3] = {3, static_cast<size_t>(hw[0]), static_cast<size_t>(hw[1])};
        const nb::dlpack::dtype dt = p.float_output() ? nb::dtype<float>() : nb::dtype<uint8_t>();
        uint8_t* ptr = out.data();
        return nb::ndarray<nb::numpy>(ptr, 3, shape, OwnerOf(std::move(out)), nullptr, dt).cast();
      },
      "data"_a, "ops"_a, "seed"_a = 0, "epoch"_a = 0, "index"_a = 0, "scaled_decode"_a = false,
      "region_decode"_a = false, "url"_a = "",
      "Decode one image and apply transform ops, as the loader does for sample `index`; "
      "returns a (3, H, W) numpy array.");

  m.def(
      "sample_plan",
      [](int width, int height, const std::vector<OpSpec>& ops, uint64_t seed, uint64_t epoch, uint64_t index,
         bool scaled_decode, bool region_decode) {
        image::Pipeline p = ValueOrThrow(MakePipeline(ops));
        image::Rng rng = image::Rng::ForSample(seed, epoch, index);
        image::SamplePlan plan = p.Plan(width, height, rng, scaled_decode, region_decode);
        nb::list boxes;
        for (const image::Box& b : plan.boxes) boxes.append(nb::make_tuple(b.top, b.left, b.height, b.width));
        nb::list flips;
        for (bool f : plan.flips) flips.append(f);
        nb::object region = nb::none();
        if (plan.region) {
          region = nb::make_tuple(plan.region->top, plan.region->left, plan.region->height, plan.region->width);
        }
        return nb::make_tuple(boxes, flips, plan.scale_denom, region);
      },
      "width"_a, "height"_a, "ops"_a, "seed"_a = 0, "epoch"_a = 0, "index"_a = 0, "scaled_decode"_a = false,
      "region_decode"_a = false,
      "The random choices the loader makes for sample `index` of an image of this size: "
      "(RandomResizedCrop boxes as (top, left, height, width), flips, JPEG scale denominator, "
      "decoded region as (top, left, height, width) or None).");

  m.def(
      "rrc_box",
      [](int width, int height, std::array<double, 2> scale, std::array<double, 2> ratio,
         const std::vector<double>& draws) {
        size_t used = 0;
        bool exhausted = false;
        image::Box b = image::RandomResizedCropBox(width, height, scale, ratio, [&] {
          if (used >= draws.size()) {
            exhausted = true;
            return 0.0;
          }
          return draws[used++];
        });
        if (exhausted) throw nb::value_error("rrc_box: not enough draws");
        return nb::make_tuple(b.top, b.left, b.height, b.width, used);
      },
      "width"_a, "height"_a, "scale"_a, "ratio"_a, "draws"_a,
      "RandomResizedCrop's (top, left, height, width) for an image, using `draws` (uniform "
      "[0, 1) values) where torchvision draws random numbers; also returns how many were used.");

  m.def(
      "decode_throughput",
      [](const std::vector<nb::bytes>& blobs, int num_threads, int rounds, int scale_denom) {
        std::vector<std::string> copies;
        copies.reserve(blobs.size());
        for (const nb::bytes& b : blobs) copies.emplace_back(View(b));
        Result<double> r = [&] {
          nb::gil_scoped_release release;
          return pipeline::DecodeThroughput(copies, num_threads, rounds, scale_denom);
        }();
        return ValueOrThrow(std::move(r));
      },
      "blobs"_a, "num_threads"_a, "rounds"_a = 1, "scale_denom"_a = 1,
      "Images per second of full-size decode only (no fetch, no transform) on N threads.");

  const PyLoaderArgs defaults;
  nb::class_<PyLoader>(m, "ImageLoader", "The C++ batch loader (use dask_ddp.data.Loader).")
      .def(
          "__init__",
          [](PyLoader* self, const PyStore& store, std::vector<std::string> keys,
             std::vector<int64_t> labels, const std::vector<OpSpec>& ops, int batch_size,
             bool shuffle, uint64_t seed, int rank, int world_size, bool drop_last,
             int num_threads, int prefetch, bool skip_errors, bool skip_missing, int max_side,
             bool scaled_decode, bool region_decode, int max_in_flight) {
            PyLoaderArgs a{batch_size,  shuffle,      seed,     rank,          world_size,
                           drop_last,   num_threads,  prefetch, skip_errors,   skip_missing,
                           max_side,    scaled_decode, region_decode, max_in_flight};
            new (self) PyLoader(store, std::move(keys), std::move(labels), ops, a);
          },
          "store"_a, "keys"_a, "labels"_a, "ops"_a, nb::kw_only(),
          "batch_size"_a = defaults.batch_size, "shuffle"_a = defaults.shuffle,
          "seed"_a = defaults.seed, "rank"_a = defaults.rank,
          "world_size"_a = defaults.world_size, "drop_last"_a = defaults.drop_last,
          "num_threads"_a = defaults.num_threads, "prefetch"_a = defaults.prefetch,
          "skip_errors"_a = defaults.skip_errors, "skip_missing"_a = defaults.skip_missing,
          "max_side"_a = defaults.max_side, "scaled_decode"_a = defaults.scaled_decode,
          "region_decode"_a = defaults.region_decode,
          "max_in_flight"_a = defaults.max_in_flight,
          "A loader reading `keys` (labels[i] for keys[i]) through `store` (an open Store, "
          "whose options it keeps), applying transform `ops` ((name, params) pairs).\n\n"
          "batch_size: samples per batch. shuffle, seed: the per-epoch order and every "
          "sample's random draws depend on (seed, epoch, index). rank, world_size: this "
          "process's shard (DistributedSampler semantics). drop_last: drop the uneven tail "
          "and the last short batch. num_threads: decode threads (0: one per core). "
          "prefetch: batch buffers in use (in flight plus held by the caller). "
          "skip_errors: leave bad images out (counted in `skipped`) instead of raising. "
          "skip_missing: with skip_errors, also skip keys naming no object. max_side: "
          "longest image side accepted. scaled_decode: allow JPEG DCT-scaled decode. "
          "region_decode: decode only the JPEG rows/columns a crop reads. max_in_flight: "
          "requests in flight for remote stores (0: the store's option).")
      .def("start_epoch", &PyLoader::StartEpoch, "epoch"_a, "start_batch"_a = 0,
           "Start (or restart) an epoch at a batch; cancels work in flight.")
      .def("next", &PyLoader::Next,
           nb::sig("def next(self) -> tuple[torch.Tensor, torch.Tensor, int] | None"),
           "The next (images, labels, batch_index), or None at the epoch's end. Raises "
           "ValueError if the loader is (or gets) closed meanwhile.")
      .def("close", &PyLoader::Close,
           "Stop the threads and free the buffers not held by tensors. Safe from any "
           "thread, also while another waits in next(); closing twice is harmless.")
      .def_prop_ro("num_batches", [](PyLoader& l) { return l.checked()->num_batches(); },
                   "Batches per epoch for this rank.")
      .def_prop_ro("num_samples", [](PyLoader& l) { return l.checked()->num_samples(); },
                   "Samples per epoch for this rank (padding included).")
      .def_prop_ro("skipped", [](PyLoader& l) { return l.checked()->skipped(); },
                   "Samples left out so far (skip_errors).")
      .def_prop_ro("decode_buffer_bytes",
                   [](PyLoader& l) { return l.checked()->decode_buffer_bytes(); },
                   "Bytes of decode buffers the threads keep between samples.")
      .def_prop_ro("sample_shape", [](PyLoader& l) {
        const auto& p = l.checked()->pipeline();
        return nb::make_tuple(3, p.out_height(), p.out_width());
      }, "(3, H, W) of each sample.")
      .def_prop_ro("float_output", [](PyLoader& l) { return l.checked()->pipeline().float_output(); },
                   "Whether images are float32 (else uint8).");

  init_shards(m, defaults);
}

}  // namespace ddp::py
