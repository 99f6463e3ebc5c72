// Bindings of the threaded batch loader: dask_ddp._core.ImageLoader.
//
// Batches cross to Python as torch tensors through DLPack without a copy: the tensor's
// owner is a capsule holding the batch buffer's lease, so the engine reuses the buffer
// only after torch frees the tensor.
#include "loader.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "ddp/store.h"
#include "errors.h"
#include "pipeline/sampler.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ddp::py {
namespace {

nb::object ImagesTensor(void* data, size_t n, const image::Pipeline& p, nb::handle owner) {
  const size_t shape[4] = {n, 3, static_cast<size_t>(p.out_height()), static_cast<size_t>(p.out_width())};
  const nb::dlpack::dtype dt = p.float_output() ? nb::dtype<float>() : nb::dtype<uint8_t>();
  return nb::ndarray<nb::pytorch>(data, 4, shape, owner, nullptr, dt).cast();
}

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

void InitImageLoader(PyLoader* self, const PyStore& store, std::vector<std::string> keys,
                     std::vector<int64_t> labels, const std::vector<OpSpec>& ops, int batch_size, bool shuffle,
                     uint64_t seed, int rank, int world_size, bool drop_last, int num_threads, int prefetch,
                     bool skip_errors, bool skip_missing, int max_side, bool scaled_decode, bool region_decode,
                     int max_in_flight) {
  PyLoaderArgs a{batch_size,  shuffle,  seed,        rank,         world_size, drop_last,     num_threads,
                 prefetch,    skip_errors, skip_missing, max_side, scaled_decode, region_decode, max_in_flight};
  new (self) PyLoader(store, std::move(keys), std::move(labels), ops, a);
}

}  // namespace

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

PyLoader::PyLoader(const PyStore& store, std::vector<std::string> keys, std::vector<int64_t> labels,
                   const std::vector<OpSpec>& ops, const PyLoaderArgs& a) {
  image::Pipeline pipeline = ValueOrThrow(MakePipeline(ops));
  pipeline::LoaderOptions o = MakeLoaderOptions(a);
  // Local files: each worker reads its own file (parallel reads, no extra thread).
  // Remote stores: one fetch thread keeps many requests in flight with GetMany.
  Result<StoreUrl> where = ParseStoreUrl(store.store->url());
  o.batched_fetch = !(where.ok() && where->local);
  nb::gil_scoped_release release;
  loader_ = ValueOrThrow(
      pipeline::Loader::Create(store.store, std::move(keys), std::move(labels), std::move(pipeline), o));
}

void PyLoader::StartEpoch(uint64_t epoch, int64_t start_batch) {
  std::shared_ptr<pipeline::Loader> loader = checked();
  Status st;
  {
    nb::gil_scoped_release release;
    st = loader->StartEpoch(epoch, start_batch);
    loader.reset();  // the last reference may join threads: not under the GIL
  }
  ThrowIfError(st);
}

void PyLoader::Restart(std::vector<std::string> keys, std::vector<int64_t> labels) {
  std::shared_ptr<pipeline::Loader> loader = checked();
  Status st;
  {
    nb::gil_scoped_release release;
    st = loader->Restart(std::move(keys), std::move(labels));
    loader.reset();  // the last reference may join threads: not under the GIL
  }
  ThrowIfError(st);
}

nb::object PyLoader::Next() {
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

void PyLoader::Close() {
  std::shared_ptr<pipeline::Loader> loader = std::move(loader_);  // under the GIL
  if (!loader) return;
  nb::gil_scoped_release release;
  loader->Shutdown();
  loader.reset();
}

namespace {

void AdoptBuffers(PyLoader& self, const std::vector<LentArray>& arrays) {
  std::shared_ptr<pipeline::Loader> loader = self.checked();
  std::vector<pipeline::ExternalBuffer> lent;
  lent.reserve(arrays.size());
  for (const LentArray& a : arrays) lent.push_back({a.data(), a.size(), KeepAlive(a)});
  ThrowIfError(loader->AdoptBuffers(std::move(lent)));
}

// The dataset indices rank `rank` of `world_size` reads in `epoch`: the engine's sampler,
// the one order every Loader and live recovery's bookkeeping use.
nb::ndarray<nb::numpy, int64_t, nb::ndim<1>> SamplerIndices(int64_t n, uint64_t epoch, int rank, int world_size,
                                                            bool shuffle, uint64_t seed, bool drop_last) {
  pipeline::SamplerOptions o{shuffle, seed, rank, world_size, drop_last};
  pipeline::DistributedSampler sampler = ValueOrThrow(pipeline::DistributedSampler::Create(n, o));
  auto* v = new std::vector<int64_t>(sampler.Indices(epoch));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  size_t shape[1] = {v->size()};
  return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(v->data(), 1, shape, owner);
}

}  // namespace

std::shared_ptr<pipeline::Loader> PyLoader::checked() const {
  if (!loader_) throw nb::value_error("the loader is closed");
  return loader_;
}

void init_loader(nb::module_& m) {
  const PyLoaderArgs defaults;
  m.def("sampler_indices", &SamplerIndices, "n"_a, "epoch"_a, "rank"_a, "world_size"_a, nb::kw_only(),
        "shuffle"_a = true, "seed"_a = 0, "drop_last"_a = false,
        "The dataset indices (int64 array) rank `rank` of `world_size` reads in `epoch`, in "
        "order: the engine's DistributedSampler (shuffle by (seed, epoch), padding by the "
        "order's head or dropping the tail, rank r at r, r + world_size, ...).");
  nb::class_<PyLoader>(m, "ImageLoader", "The C++ batch loader (use dask_ddp.data.Loader).")
      .def("__init__", &InitImageLoader, "store"_a, "keys"_a, "labels"_a, "ops"_a, nb::kw_only(),
           "batch_size"_a = defaults.batch_size, "shuffle"_a = defaults.shuffle, "seed"_a = defaults.seed,
           "rank"_a = defaults.rank, "world_size"_a = defaults.world_size, "drop_last"_a = defaults.drop_last,
           "num_threads"_a = defaults.num_threads, "prefetch"_a = defaults.prefetch,
           "skip_errors"_a = defaults.skip_errors, "skip_missing"_a = defaults.skip_missing,
           "max_side"_a = defaults.max_side, "scaled_decode"_a = defaults.scaled_decode,
           "region_decode"_a = defaults.region_decode, "max_in_flight"_a = defaults.max_in_flight,
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
      .def("restart", &PyLoader::Restart, "keys"_a, "labels"_a,
           "Read `keys` (labels[i] for keys[i], under the same store) from now on, keeping "
           "the threads, batch buffers (lent ones too) and options: cancels work in flight; "
           "next() returns None until start_epoch() starts the new list. Batches already "
           "returned stay as they are. ValueError for a loader over tar shards or a closed "
           "one, or when the counts of keys and labels differ.")
      .def("next", &PyLoader::Next, nb::sig("def next(self) -> tuple[torch.Tensor, torch.Tensor, int] | None"),
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
      .def_prop_ro("decode_buffer_bytes", [](PyLoader& l) { return l.checked()->decode_buffer_bytes(); },
                   "Bytes of decode buffers the threads keep between samples.")
      .def_prop_ro(
          "sample_shape",
          [](PyLoader& l) {
            const auto& p = l.checked()->pipeline();
            return nb::make_tuple(3, p.out_height(), p.out_width());
          },
          "(3, H, W) of each sample.")
      .def_prop_ro("float_output", [](PyLoader& l) { return l.checked()->pipeline().float_output(); },
                   "Whether images are float32 (else uint8).")
      .def_prop_ro("batch_buffer_bytes", [](PyLoader& l) { return l.checked()->batch_buffer_bytes(); },
                   "Bytes of one batch's images and labels: what each lent buffer must hold.")
      .def("adopt_buffers", &AdoptBuffers, "buffers"_a,
           "Lend the loader memory for batches, images and labels (1-D uint8 CPU arrays, "
           "8-byte aligned, of at least batch_buffer_bytes each, e.g. pinned torch tensors' numpy views): used before "
           "its own buffers and kept referenced while a batch may use them.");
}

}  // namespace ddp::py
