// Transforms with their output shape declared up front (as ffcv does), run on RGB8 images
// and written straight into a batch slot as CHW (float32 or uint8).
//
// The ops and parameters follow torchvision's: Resize, CenterCrop, RandomResizedCrop,
// RandomHorizontalFlip, ToTensor, Normalize, PILToTensor. Randomness comes from a per-sample
// Rng, drawn when a sample is planned (from its header size, before decode), so a
// random crop can choose a DCT-scaled JPEG decode.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/status.h"
#include "image/decode.h"
#include "image/rng.h"

namespace ddp::image {

enum class OpKind { kResize, kCenterCrop, kRandomResizedCrop, kHorizontalFlip, kToTensor, kNormalize, kPILToTensor };

struct TransformOp {
  OpKind kind = OpKind::kToTensor;
  int height = 0;               // Resize: 0 with width > 0 means "shorter side = width"
  int width = 0;
  bool antialias = true;        // Resize / RandomResizedCrop downscaling
  std::array<double, 2> scale{0.08, 1.0};           // RandomResizedCrop
  std::array<double, 2> ratio{3.0 / 4.0, 4.0 / 3.0};  // RandomResizedCrop
  double p = 0.5;               // RandomHorizontalFlip
  std::array<double, 3> mean{0, 0, 0};  // Normalize
  std::array<double, 3> std{1, 1, 1};
};

// A crop box in the coordinates of the image it applies to: top, left, height, width.
struct Box {
  int top = 0, left = 0, height = 0, width = 0;
  bool operator==(const Box&) const = default;
};

// torchvision's RandomResizedCrop.get_params, with `uniform()` returning draws in [0, 1)
// where torchvision draws from torch's generator: per try, one for the scale, one for the
// log-ratio, and (if the box fits) one each for top and left (floor(u * range)); after 10
// failed tries the central crop fallback. Float32 where torchvision computes in float32.
template <typename Uniform>
Box RandomResizedCropBox(int width, int height, std::array<double, 2> scale,
                         std::array<double, 2> ratio, Uniform&& uniform) {
  const double area = static_cast<double>(height) * width;
  const float log_r0 = std::log(static_cast<float>(ratio[0]));
  const float log_r1 = std::log(static_cast<float>(ratio[1]));
  for (int attempt = 0; attempt < 10; ++attempt) {
    const float s = static_cast<float>(scale[0] + uniform() * (scale[1] - scale[0]));
    const double target_area = area * static_cast<double>(s);
    const float lr = static_cast<float>(log_r0 + uniform() * (static_cast<double>(log_r1) - log_r0));
    const double aspect = static_cast<double>(std::exp(lr));
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target_area * aspect)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int top = static_cast<int>(uniform() * (height - h + 1));
      const int left = static_cast<int>(uniform() * (width - w + 1));
      return {top, left, h, w};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  const double rmin = std::min(ratio[0], ratio[1]), rmax = std::max(ratio[0], ratio[1]);
  int w = width, h = height;
  if (in_ratio < rmin) {
    h = static_cast<int>(std::nearbyint(w / rmin));
  } else if (in_ratio > rmax) {
    w = static_cast<int>(std::nearbyint(h * rmax));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

// torchvision's Resize(int) size rule: the shorter side becomes `size`, the longer side
// int(size * long / short). Returns {height, width}.
std::array<int, 2> ResizeShorterSide(int width, int height, int size);

// The randomness and geometry of one sample, fixed before decode.
struct SamplePlan {
  int scale_denom = 1;        // DCT-scaled JPEG decode (1, 2, 4, 8)
  int src_width = 0;          // full-size image
  int src_height = 0;
  std::vector<Box> boxes;     // one per RandomResizedCrop, in op order (full-size coords)
  std::vector<bool> flips;    // one per RandomHorizontalFlip, in op order
  // The part of the image the first geometric op reads (full-resolution coordinates),
  // when decoding only that part is possible (see DecodeImage's `region`).
  std::optional<Region> region;
};

class Pipeline {
 public:
  // Validates the ops: the output size must not depend on the image (end with a
  // CenterCrop, RandomResizedCrop or Resize((h, w))), Normalize needs ToTensor before it.
  // `fixed_size=false` allows a size that depends on the image (single images only:
  // out_height()/out_width() are then 0 and OutputSize() gives the size).
  static Result<Pipeline> Create(std::vector<TransformOp> ops, bool fixed_size = true);

  // {height, width} of the output for an input of this size.
  std::array<int, 2> OutputSize(int src_width, int src_height) const;

  int out_height() const { return out_h_; }
  int out_width() const { return out_w_; }
  bool float_output() const { return float_out_; }
  // Bytes of one output sample (3 x H x W, float32 or uint8); 0 if not fixed.
  size_t sample_bytes() const;
  size_t sample_bytes(int height, int width) const;

  // Draws the sample's randomness and, if `allow_scaled_decode`, picks the coarsest JPEG
  // DCT scale that still leaves the first resize at least its output size; if
  // `allow_region_decode`, records the region a crop-first pipeline reads.
  SamplePlan Plan(int src_width, int src_height, Rng& rng, bool allow_scaled_decode,
                  bool allow_region_decode = false) const;

  // Runs the ops on `img` (decoded as planned, possibly scaled and/or only a region) and writes 3 x H x W into `out` (H x W is
  // OutputSize(plan.src_width, plan.src_height)).
  Status Apply(const Image& img, const SamplePlan& plan, void* out) const;

 private:
  std::vector<TransformOp> ops_;
  int out_h_ = 0, out_w_ = 0;
  bool float_out_ = false;
  std::array<float, 3> mul_{1, 1, 1}, add_{0, 0, 0};  // out = px * mul + add
};

}  // namespace ddp::image
