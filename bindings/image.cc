// Bindings of one image's decode and transforms, for tests and tools: decode_image,
// image_info, transform_image (as the loader does one sample), sample_plan (the loader's
// random choices for a sample) and rrc_box (torchvision's RandomResizedCrop parameters
// from given draws). Decodes run with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "convert.h"
#include "errors.h"
#include "image/decode.h"
#include "image/transforms.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ddp::py {
namespace {

// `auto`: the ndarray type names the array's dtype in the stub.
auto DecodeImage(nb::bytes data, const std::string& url, int max_side, int scale_denom) {
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
}

nb::tuple ImageInfo(nb::bytes data, const std::string& url, int max_side) {
  image::DecodeOptions o;
  o.max_side = max_side;
  image::ImageInfo info = ValueOrThrow(image::ReadImageInfo(View(data), url, o));
  return nb::make_tuple(info.width, info.height, info.format == image::Format::kJpeg ? "jpeg" : "png");
}

// Decodes `data` and applies `p` to it as the loader does for (seed, epoch, index) into
// `out`, sized here; `hw` receives the output's height and width.
Status TransformInto(std::string_view data, const std::string& url, const image::Pipeline& p,
                     uint64_t seed, uint64_t epoch, uint64_t index, bool scaled_decode,
                     bool region_decode, std::vector<uint8_t>& out, std::array<int, 2>& hw) {
  DDP_ASSIGN_OR_RETURN(image::ImageInfo info, image::ReadImageInfo(data, url));
  hw = p.OutputSize(info.width, info.height);
  out.resize(p.sample_bytes(hw[0], hw[1]));
  image::Rng rng = image::Rng::ForSample(seed, epoch, index);
  const bool jpeg = info.format == image::Format::kJpeg;
  image::SamplePlan plan = p.Plan(info.width, info.height, rng, scaled_decode && jpeg, region_decode && jpeg);
  image::Image img;
  DDP_RETURN_IF_ERROR(
      image::DecodeImage(data, url, {}, plan.scale_denom, img, plan.region ? &*plan.region : nullptr));
  return p.Apply(img, plan, out.data());
}

auto TransformImage(nb::bytes data, const std::vector<OpSpec>& ops, uint64_t seed, uint64_t epoch,
                          uint64_t index, bool scaled_decode, bool region_decode, const std::string& url) {
  image::Pipeline p = ValueOrThrow(MakePipeline(ops, /*fixed_size=*/false));
  std::vector<uint8_t> out;
  std::array<int, 2> hw{0, 0};
  Status st;
  {
    nb::gil_scoped_release release;
    st = TransformInto(View(data), url, p, seed, epoch, index, scaled_decode, region_decode, out, hw);
  }
  ThrowIfError(st);
  const size_t shape[3] = {3, static_cast<size_t>(hw[0]), static_cast<size_t>(hw[1])};
  const nb::dlpack::dtype dt = p.float_output() ? nb::dtype<float>() : nb::dtype<uint8_t>();
  uint8_t* ptr = out.data();
  return nb::ndarray<nb::numpy>(ptr, 3, shape, OwnerOf(std::move(out)), nullptr, dt).cast();
}

nb::tuple SamplePlan(int width, int height, const std::vector<OpSpec>& ops, uint64_t seed, uint64_t epoch,
                     uint64_t index, bool scaled_decode, bool region_decode) {
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
}

nb::tuple RrcBox(int width, int height, std::array<double, 2> scale, std::array<double, 2> ratio,
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
}

}  // namespace

void init_image(nb::module_& m) {
  const image::DecodeOptions dd;
  m.def("decode_image", &DecodeImage, "data"_a, "url"_a = "", "max_side"_a = dd.max_side, "scale_denom"_a = 1,
        "Decode JPEG or PNG bytes to an RGB uint8 array (H, W, 3). `url` names the data in errors.");
  m.def("image_info", &ImageInfo, "data"_a, "url"_a = "", "max_side"_a = dd.max_side,
        "(width, height, format) from the header.");
  m.def("transform_image", &TransformImage, "data"_a, "ops"_a, "seed"_a = 0, "epoch"_a = 0, "index"_a = 0,
        "scaled_decode"_a = false, "region_decode"_a = false, "url"_a = "",
        "Decode one image and apply transform ops, as the loader does for sample `index`; "
        "returns a (3, H, W) numpy array.");
  m.def("sample_plan", &SamplePlan, "width"_a, "height"_a, "ops"_a, "seed"_a = 0, "epoch"_a = 0, "index"_a = 0,
        "scaled_decode"_a = false, "region_decode"_a = false,
        "The random choices the loader makes for sample `index` of an image of this size: "
        "(RandomResizedCrop boxes as (top, left, height, width), flips, JPEG scale denominator, "
        "decoded region as (top, left, height, width) or None).");
  m.def("rrc_box", &RrcBox, "width"_a, "height"_a, "scale"_a, "ratio"_a, "draws"_a,
        "RandomResizedCrop's (top, left, height, width) for an image, using `draws` (uniform "
        "[0, 1) values) where torchvision draws random numbers; also returns how many were used.");
}

}  // namespace ddp::py
