#include "image/transforms.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>

#include "common/simd.h"
#include "image/image_testutil.h"
#include "image/resize.h"

namespace ddp::image {
namespace {

TransformOp Op(OpKind k, int h = 0, int w = 0) {
  TransformOp o;
  o.kind = k;
  o.height = h;
  o.width = w;
  return o;
}

Image Gradient(int w, int h) {
  Image img;
  img.width = w;
  img.height = h;
  img.pixels = testing::Pattern(w, h);
  return img;
}

TEST(Transforms, ResizeShorterSideFollowsTorchvision) {
  EXPECT_EQ(ResizeShorterSide(500, 375, 256), (std::array<int, 2>{256, 341}));
  EXPECT_EQ(ResizeShorterSide(375, 500, 256), (std::array<int, 2>{341, 256}));
  EXPECT_EQ(ResizeShorterSide(300, 300, 224), (std::array<int, 2>{224, 224}));
}

TEST(Transforms, RandomResizedCropBoxUsesDrawsInOrder) {
  // scale draw 1.0 -> whole area; ratio draw 0.5 -> log-ratio 0 -> aspect 1; 100x100 box
  // in a 100x100 image; then top/left draws.
  std::deque<double> d = {0.9999999, 0.5, 0.3, 0.7};
  auto u = [&] {
    double v = d.front();
    d.pop_front();
    return v;
  };
  Box b = RandomResizedCropBox(100, 100, {0.08, 1.0}, {3.0 / 4, 4.0 / 3}, u);
  EXPECT_EQ(b, (Box{0, 0, 100, 100}));
  // A box that never fits (scale ~1 and an extreme ratio on a wide image) falls back to
  // the central crop after 10 tries, consuming exactly 20 draws.
  int draws = 0;
  auto extreme = [&] {
    ++draws;
    return (draws % 2 == 1) ? 0.99999 : 0.0;  // max scale, min ratio: never fits
  };
  Box f = RandomResizedCropBox(400, 100, {0.99, 1.0}, {0.5, 4.0}, extreme);
  EXPECT_EQ(draws, 20);
  // in_ratio 4.0 is not > max ratio 4.0, so the whole image.
  EXPECT_EQ(f, (Box{0, 0, 100, 400}));
  draws = 0;
  Box g = RandomResizedCropBox(1000, 100, {0.99, 1.0}, {0.5, 2.0}, extreme);
  EXPECT_EQ(g, (Box{0, 400, 100, 200}));  // w = round(100 * 2), centred
}

TEST(Transforms, CreateValidates) {
  EXPECT_EQ(Pipeline::Create({Op(OpKind::kResize, 0, 256), Op(OpKind::kToTensor)}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(Pipeline::Create({Op(OpKind::kCenterCrop, 8, 8)}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Pipeline::Create({Op(OpKind::kCenterCrop, 8, 8), Op(OpKind::kNormalize), Op(OpKind::kToTensor)})
                .status()
                .code(),
            Code::kInvalidArgument);
  auto p = Pipeline::Create({Op(OpKind::kResize, 0, 256), Op(OpKind::kCenterCrop, 224, 200), Op(OpKind::kToTensor)});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->out_height(), 224);
  EXPECT_EQ(p->out_width(), 200);
  EXPECT_TRUE(p->float_output());
  EXPECT_EQ(p->sample_bytes(), 3u * 224 * 200 * 4);
}

TEST(Transforms, CenterCropIsExactAndChw) {
  auto p = Pipeline::Create({Op(OpKind::kCenterCrop, 3, 4), Op(OpKind::kPILToTensor)});
  ASSERT_TRUE(p.ok());
  Image img = Gradient(11, 8);  // left = round(3.5) = 4, top = round(2.5) = 2 (half to even)
  Rng rng(1);
  SamplePlan plan = p->Plan(11, 8, rng, false);
  std::vector<uint8_t> out(p->sample_bytes());
  ASSERT_TRUE(p->Apply(img, plan, out.data()).ok());
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 3; ++y) {
      for (int x = 0; x < 4; ++x) {
        EXPECT_EQ(out[c * 12 + y * 4 + x], img.pixels[((y + 2) * 11 + (x + 4)) * 3 + c]);
      }
    }
  }
}

TEST(Transforms, CenterCropPadsLikeTorchvision) {
  auto p = Pipeline::Create({Op(OpKind::kCenterCrop, 4, 7), Op(OpKind::kPILToTensor)});
  ASSERT_TRUE(p.ok());
  Image img = Gradient(4, 4);
  Rng rng(1);
  std::vector<uint8_t> out(p->sample_bytes());
  ASSERT_TRUE(p->Apply(img, p->Plan(4, 4, rng, false), out.data()).ok());
  // pad left (7-4)//2 = 1, right 2
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], img.pixels[0]);
  EXPECT_EQ(out[5], 0);
  EXPECT_EQ(out[6], 0);
}

TEST(Transforms, FlipAndNormalize) {
  TransformOp flip = Op(OpKind::kHorizontalFlip);
  flip.p = 1.0;
  TransformOp norm = Op(OpKind::kNormalize);
  norm.mean = {0.5, 0.5, 0.5};
  norm.std = {0.25, 0.5, 1.0};
  auto p = Pipeline::Create({Op(OpKind::kCenterCrop, 8, 6), flip, Op(OpKind::kToTensor), norm});
  ASSERT_TRUE(p.ok());
  Image img = Gradient(6, 8);
  Rng rng(3);
  std::vector<float> out(3 * 8 * 6);
  ASSERT_TRUE(p->Apply(img, p->Plan(6, 8, rng, false), out.data()).ok());
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 8; ++y) {
      for (int x = 0; x < 6; ++x) {
        const float px = img.pixels[(y * 6 + (5 - x)) * 3 + c] / 255.0f;
        EXPECT_NEAR(out[c * 48 + y * 6 + x], (px - 0.5f) / norm.std[c], 1e-5);
      }
    }
  }
}

TEST(Transforms, PlanIsDeterministicAndPicksScaledDecode) {
  TransformOp rrc = Op(OpKind::kRandomResizedCrop, 32, 32);
  auto p = Pipeline::Create({rrc, Op(OpKind::kHorizontalFlip), Op(OpKind::kToTensor)});
  ASSERT_TRUE(p.ok());
  Rng a = Rng::ForSample(7, 2, 11), b = Rng::ForSample(7, 2, 11), c = Rng::ForSample(7, 3, 11);
  SamplePlan pa = p->Plan(640, 480, a, true), pb = p->Plan(640, 480, b, true), pc = p->Plan(640, 480, c, true);
  EXPECT_EQ(pa.boxes, pb.boxes);
  EXPECT_EQ(pa.flips, pb.flips);
  EXPECT_NE(pa.boxes, pc.boxes);
  const double f = std::min(pa.boxes[0].width / 32.0, pa.boxes[0].height / 32.0);
  EXPECT_GE(f, pa.scale_denom);
  EXPECT_LT(f, pa.scale_denom == 8 ? 1e9 : 2.0 * pa.scale_denom);
  Rng d = Rng::ForSample(7, 2, 11);
  EXPECT_EQ(p->Plan(640, 480, d, false).scale_denom, 1);
}

TEST(Transforms, ScaledDecodeGivesNearlyTheSamePixels) {
  TransformOp rrc = Op(OpKind::kRandomResizedCrop, 24, 24);
  rrc.scale = {0.9, 1.0};
  auto p = Pipeline::Create({rrc, Op(OpKind::kPILToTensor)});
  ASSERT_TRUE(p.ok());
  const int W = 400, H = 300;
  auto px = testing::Pattern(W, H);
  std::string jpg = testing::EncodeJpeg(px, W, H, 3, 95);
  Rng r1 = Rng::ForSample(1, 0, 5), r2 = Rng::ForSample(1, 0, 5);
  SamplePlan scaled = p->Plan(W, H, r1, true), full = p->Plan(W, H, r2, false);
  ASSERT_GT(scaled.scale_denom, 1);
  Image a, b;
  ASSERT_TRUE(DecodeImage(jpg, "x", {}, scaled.scale_denom, a).ok());
  ASSERT_TRUE(DecodeImage(jpg, "x", {}, 1, b).ok());
  std::vector<uint8_t> oa(p->sample_bytes()), ob(p->sample_bytes());
  ASSERT_TRUE(p->Apply(a, scaled, oa.data()).ok());
  ASSERT_TRUE(p->Apply(b, full, ob.data()).ok());
  double s = 0;
  for (size_t i = 0; i < oa.size(); ++i) s += std::abs(int(oa[i]) - int(ob[i]));
  EXPECT_LT(s / oa.size(), 4.0);
}

// The fused last step (resize rows written straight into CHW, with the flips pending
// after it) gives exactly the pixels of resizing to an image, then flipping, then
// normalising: checked against that sequence built from ResizeRgb8.
TEST(Transforms, FusedResizeWritesTheSameValuesAsSeparatePasses) {
  const int W = 203, H = 151;
  Image img = Gradient(W, H);
  TransformOp flip = Op(OpKind::kHorizontalFlip);
  flip.p = 1.0;
  TransformOp norm = Op(OpKind::kNormalize);
  norm.mean = {0.485, 0.456, 0.406};
  norm.std = {0.229, 0.224, 0.225};
  const Rgb8View whole{img.pixels.data(), W, H, static_cast<size_t>(3) * W};
  struct Case {
    std::vector<TransformOp> ops;
    int oh, ow;
    bool flip, area;
  };
  const std::vector<Case> cases = {
      {{Op(OpKind::kResize, 64, 48), flip, Op(OpKind::kToTensor), norm}, 64, 48, true, true},
      {{flip, Op(OpKind::kResize, 300, 250), Op(OpKind::kToTensor), norm}, 300, 250, true, false},
      {{flip, Op(OpKind::kResize, 90, 120), flip, Op(OpKind::kPILToTensor)}, 90, 120, false, false},
      {{Op(OpKind::kResize, 151, 203), Op(OpKind::kPILToTensor)}, 151, 203, false, false},
      {{Op(OpKind::kResize, 40, 224), flip, Op(OpKind::kToTensor), norm}, 40, 224, true, false},
      {{Op(OpKind::kResize, 40, 224), flip, Op(OpKind::kPILToTensor)}, 40, 224, true, false},
      {{Op(OpKind::kResize, 30, 15), Op(OpKind::kToTensor), norm}, 30, 15, false, true},
  };
  // Every SIMD level of the resize and output loops the CPU has (the SSE2 ones everywhere).
  for (const Simd level : {Simd::kAvx2, Simd::kSsse3, Simd::kSse2}) {
    CapSimdForTesting(level);
    for (const Case& c : cases) {
      auto p = Pipeline::Create(c.ops);
      ASSERT_TRUE(p.ok()) << p.status().message();
      Rng rng(1);
      std::vector<uint8_t> got(p->sample_bytes());
      ASSERT_TRUE(p->Apply(img, p->Plan(W, H, rng, false), got.data()).ok());
      std::vector<uint8_t> hwc;
      ResizeRgb8(whole, c.ow, c.oh, c.area ? ResizeFilter::kArea : ResizeFilter::kBilinear, hwc);
      const size_t plane = static_cast<size_t>(c.oh) * c.ow;
      for (int ch = 0; ch < 3; ++ch) {
        const float m = p->float_output() ? static_cast<float>(1.0f / 255.0f / norm.std[ch]) : 1.0f;
        const float a = p->float_output() ? static_cast<float>((0.0 - norm.mean[ch]) / norm.std[ch]) : 0.0f;
        for (int y = 0; y < c.oh; ++y) {
          for (int x = 0; x < c.ow; ++x) {
            const int sx = c.flip ? c.ow - 1 - x : x;
            const uint8_t px = hwc[(static_cast<size_t>(y) * c.ow + sx) * 3 + ch];
            const size_t at = ch * plane + static_cast<size_t>(y) * c.ow + x;
            if (p->float_output()) {
              float v;
              std::memcpy(&v, got.data() + at * sizeof(float), sizeof v);
              ASSERT_EQ(v, px * m + a) << ch << " " << y << " " << x;
            } else {
              ASSERT_EQ(got[at], px) << ch << " " << y << " " << x;
            }
          }
        }
      }
    }
  }
  CapSimdForTesting(Simd::kAvx2);
}

}  // namespace
}  // namespace ddp::image
