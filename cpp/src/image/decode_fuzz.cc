// libFuzzer target: arbitrary bytes through header read, (scaled / region) decode and the
// training transform, as a loader thread runs them. Any crash, sanitizer report, leak or
// timeout is a bug; errors are the expected outcome for most inputs.
// Build and run: tools/fuzz_smoke.sh [seconds].
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "image/decode.h"
#include "image/transforms.h"

namespace {

using namespace ddp::image;

const Pipeline& Train() {
  static const Pipeline p = [] {
    TransformOp rrc, flip, tt, norm;
    rrc.kind = OpKind::kRandomResizedCrop;
    rrc.height = rrc.width = 24;
    flip.kind = OpKind::kHorizontalFlip;
    tt.kind = OpKind::kToTensor;
    norm.kind = OpKind::kNormalize;
    norm.mean = {0.5, 0.5, 0.5};
    norm.std = {0.25, 0.25, 0.25};
    return Pipeline::Create({rrc, flip, tt, norm}).value();
  }();
  return p;
}

const Pipeline& Eval() {
  static const Pipeline p = [] {
    TransformOp resize, crop, tt;
    resize.kind = OpKind::kResize;
    resize.width = 20;  // shorter side
    crop.kind = OpKind::kCenterCrop;
    crop.height = crop.width = 16;
    tt.kind = OpKind::kPILToTensor;
    return Pipeline::Create({resize, crop, tt}).value();
  }();
  return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  DecodeOptions opt;
  opt.max_side = 1024;         // keep each input fast; the limit path is fuzzed too
  opt.max_pixels = 1u << 16;
  auto info = ReadImageInfo(bytes, "fuzz://input", opt);
  if (!info.ok()) return 0;
  const uint64_t h = size * 0x9E3779B97F4A7C15ull;
  static thread_local Image img;
  static thread_local std::vector<float> out_f(3 * 24 * 24);
  static thread_local std::vector<uint8_t> out_u(3 * 16 * 16);
  // A JPEG goes through both decode paths (full and region), which must hold the same
  // limits (size, scan count); PNGs once.
  const bool jpeg = info->format == Format::kJpeg;
  for (const bool region : {false, true}) {
    if (region && !jpeg) break;
    Rng rng = Rng::ForSample(h, 0, size);
    SamplePlan plan = Train().Plan(info->width, info->height, rng, jpeg, region);
    if (DecodeImage(bytes, "fuzz://input", opt, plan.scale_denom, img, plan.region ? &*plan.region : nullptr).ok()) {
      Train().Apply(img, plan, out_f.data()).IgnoreError();  // errors are fine, crashes not
    }
  }
  {
    Rng rng = Rng::ForSample(h, 1, size);
    SamplePlan plan = Eval().Plan(info->width, info->height, rng, jpeg, false);
    if (DecodeImage(bytes, "fuzz://input", opt, plan.scale_denom, img).ok()) {
      Eval().Apply(img, plan, out_u.data()).IgnoreError();
    }
  }
  return 0;
}
