#include "image/resize.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "common/simd.h"

#ifdef DDP_TEST_WITH_OPENCV
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#endif

namespace ddp::image {
namespace {

Rgb8View View(const std::vector<uint8_t>& px, int w, int h) {
  return {px.data(), w, h, static_cast<size_t>(3) * w};
}

// Random pixels with smooth regions and hard edges (noise, blocks, gradients).
std::vector<uint8_t> Photo(int w, int h, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> px(static_cast<size_t>(3) * w * h);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        const int smooth = (x * 7 + y * 3 + c * 50) % 256;
        const bool block = ((x / 5 + y / 7) % 3) == 0;
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>(block ? byte(gen) : (smooth + byte(gen) % 9) % 256);
      }
    }
  }
  return px;
}

TEST(Resize, RowsGiveTheSamePixelsAsTheWholeImage) {
  // Every filter path: bilinear up/down, 2x2, integer area, fractional area, same size;
  // from a strided view (a crop) as the transforms pass it.
  const int W = 157, H = 121;
  const std::vector<uint8_t> px = Photo(W, H, 9);
  const Rgb8View crop{px.data() + 3 * (static_cast<size_t>(W) * 5 + 7), 140, 110, static_cast<size_t>(3) * W};
  struct Case {
    int w, h;
    ResizeFilter f;
  };
  for (const Case& c : {Case{224, 224, ResizeFilter::kBilinear}, Case{70, 55, ResizeFilter::kBilinear},
                        Case{70, 55, ResizeFilter::kArea}, Case{35, 22, ResizeFilter::kArea},
                        Case{61, 47, ResizeFilter::kArea}, Case{100, 90, ResizeFilter::kBilinear},
                        Case{140, 110, ResizeFilter::kArea}}) {
    std::vector<uint8_t> whole;
    ResizeRgb8(crop, c.w, c.h, c.f, whole);
    std::vector<uint8_t> rows(static_cast<size_t>(3) * c.w * c.h, 0);
    int next = 0;
    ResizeRgb8Rows(crop, c.w, c.h, c.f, [&](int y, const uint8_t* row) {
      EXPECT_EQ(y, next++);
      std::memcpy(rows.data() + static_cast<size_t>(y) * 3 * c.w, row, static_cast<size_t>(3) * c.w);
    });
    EXPECT_EQ(next, c.h);
    whole.resize(rows.size());
    EXPECT_EQ(rows, whole) << c.w << "x" << c.h << " filter " << static_cast<int>(c.f);
  }
}

// Every SIMD level (chosen at run time: the AVX2 loops, and at the SSSE3 level the SSE2
// ones) gives the pixels of the SSE2 loops, for every filter path, odd widths (the
// SIMD/scalar split) and strided views.
TEST(Resize, EverySimdLevelGivesTheSamePixels) {
  if (SimdLevel() == Simd::kSse2) GTEST_SKIP() << "only the SSE2 loops run on this CPU";
  const int W = 611, H = 203;
  const std::vector<uint8_t> px = Photo(W, H, 17);
  const int sizes[][4] = {{600, 200, 224, 224}, {301, 203, 224, 224}, {500, 150, 224, 224},
                          {611, 203, 97, 61},   {150, 120, 224, 224}, {17, 13, 5, 3},
                          {400, 200, 200, 100}, {333, 201, 111, 67},  {5, 7, 31, 29},
                          {6, 3, 2, 2},         {611, 203, 610, 202}, {64, 64, 223, 225}};
  for (const auto& sz : sizes) {
    const Rgb8View view{px.data() + 3 * (W - sz[0]), sz[0], sz[1], static_cast<size_t>(3) * W};
    for (ResizeFilter f : {ResizeFilter::kBilinear, ResizeFilter::kArea}) {
      std::vector<uint8_t> plain;
      CapSimdForTesting(Simd::kSse2);
      ResizeRgb8(view, sz[2], sz[3], f, plain);
      for (Simd level : {Simd::kSsse3, Simd::kAvx2}) {
        std::vector<uint8_t> fast;
        CapSimdForTesting(level);
        ResizeRgb8(view, sz[2], sz[3], f, fast);
        EXPECT_EQ(fast, plain) << sz[0] << "x" << sz[1] << " -> " << sz[2] << "x" << sz[3] << " filter "
                               << static_cast<int>(f) << " level " << SimdName(level);
      }
    }
  }
  CapSimdForTesting(Simd::kAvx2);
}

TEST(Resize, SameSizeCopiesFromAStridedView) {
  // A 2x2 view into a 4-pixel-wide image.
  std::vector<uint8_t> px(3 * 4 * 2);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i);
  std::vector<uint8_t> out;
  ResizeRgb8({px.data() + 3, 2, 2, 12}, 2, 2, ResizeFilter::kBilinear, out);
  const std::vector<uint8_t> want = {3, 4, 5, 6, 7, 8, 15, 16, 17, 18, 19, 20};
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + 12), want);
}

TEST(Resize, IntegerAreaIsTheBlockMeanRoundedHalfToEven) {
  // 4x1 -> 2x1 (factor 2 x 1): means (10+11)/2 = 10.5 -> 10 and (12+13)/2 = 12.5 -> 12.
  std::vector<uint8_t> px = {10, 0, 255, 11, 0, 255, 12, 1, 0, 13, 2, 0};
  std::vector<uint8_t> out;
  ResizeRgb8(View(px, 4, 1), 2, 1, ResizeFilter::kArea, out);
  const std::vector<uint8_t> want = {10, 0, 255, 12, 2, 0};
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + 6), want);
}

TEST(Resize, FractionalAreaWeighsPartlyCoveredPixels) {
  // 3x1 -> 2x1: each output covers 1.5 pixels: (a + b/2) / 1.5 and (b/2 + c) / 1.5.
  std::vector<uint8_t> px = {90, 0, 0, 30, 0, 0, 150, 0, 0};
  std::vector<uint8_t> out;
  ResizeRgb8(View(px, 3, 1), 2, 1, ResizeFilter::kArea, out);
  EXPECT_EQ(out[0], 70);   // (90 + 15) / 1.5
  EXPECT_EQ(out[3], 110);  // (15 + 150) / 1.5
}

TEST(Resize, BilinearUsesHalfPixelCentresAndRepeatsTheEdge) {
  // 2x1 -> 4x1: source positions -0.25 (edge), 0.25, 0.75, 1.25 (edge).
  std::vector<uint8_t> px = {0, 0, 0, 200, 100, 40};
  std::vector<uint8_t> out;
  ResizeRgb8(View(px, 2, 1), 4, 1, ResizeFilter::kBilinear, out);
  const std::vector<uint8_t> want = {0, 0, 0, 50, 25, 10, 150, 75, 30, 200, 100, 40};
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + 12), want);
}

TEST(Resize, HalvingBilinearlyIsTheTwoByTwoMean) {
  const std::vector<uint8_t> px = Photo(8, 6, 1);
  std::vector<uint8_t> bilinear, area;
  ResizeRgb8(View(px, 8, 6), 4, 3, ResizeFilter::kBilinear, bilinear);
  ResizeRgb8(View(px, 8, 6), 4, 3, ResizeFilter::kArea, area);
  EXPECT_EQ(bilinear, area);
}

#ifdef DDP_TEST_WITH_OPENCV
// The pixels are those of the cv::resize this unit replaced, for every size pair the
// transforms can ask for: up, down, mixed, integer and fractional factors, odd widths
// (the SIMD/scalar split), and views into a larger image.
TEST(Resize, SamePixelsAsOpenCV) {
  cv::setNumThreads(0);
  const int sizes[][4] = {
      {500, 375, 256, 341}, {375, 500, 341, 256}, {640, 480, 224, 224}, {333, 257, 100, 150},
      {120, 91, 300, 400},  {60, 200, 128, 426},  {17, 13, 5, 3},       {7, 9, 31, 29},
      {400, 300, 200, 150}, {400, 300, 100, 75},  {401, 299, 200, 150}, {256, 256, 224, 224},
      {1, 1, 5, 7},         {9, 1, 3, 1},         {1000, 750, 113, 97}, {257, 255, 256, 341},
      {300, 200, 150, 400}, {224, 224, 224, 224}, {800, 600, 399, 301}, {33, 65, 32, 64},
  };
  int compared = 0;
  for (const auto& s : sizes) {
    const int sw = s[0], sh = s[1], dw = s[2], dh = s[3];
    for (int stride_pad : {0, 5}) {
      const int full_w = sw + stride_pad;
      const std::vector<uint8_t> px = Photo(full_w, sh, static_cast<uint32_t>(sw * 31 + sh));
      const Rgb8View view{px.data() + 3 * (stride_pad > 0 ? 2 : 0), sw, sh, static_cast<size_t>(3) * full_w};
      const cv::Mat src(sh, sw, CV_8UC3, const_cast<uint8_t*>(view.data), view.stride);
      for (ResizeFilter f : {ResizeFilter::kBilinear, ResizeFilter::kArea}) {
        if (f == ResizeFilter::kArea && (dw > sw || dh > sh)) continue;  // area only shrinks
        cv::Mat want;
        cv::resize(src, want, cv::Size(dw, dh), 0, 0, f == ResizeFilter::kArea ? cv::INTER_AREA : cv::INTER_LINEAR);
        std::vector<uint8_t> got;
        ResizeRgb8(view, dw, dh, f, got);
        const std::string what = std::to_string(sw) + "x" + std::to_string(sh) + " -> " +
                                 std::to_string(dw) + "x" + std::to_string(dh) +
                                 (f == ResizeFilter::kArea ? " area" : " bilinear");
        ASSERT_TRUE(want.isContinuous()) << what;
        int differ = 0, first = -1;
        for (size_t i = 0; i < static_cast<size_t>(3) * dw * dh; ++i) {
          if (got[i] != want.data[i]) {
            if (first < 0) first = static_cast<int>(i);
            ++differ;
          }
        }
        EXPECT_EQ(differ, 0) << what << ": first at byte " << first << ", ours "
                             << (first >= 0 ? int(got[first]) : 0) << " OpenCV "
                             << (first >= 0 ? int(want.data[first]) : 0);
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 60);
}
#else
TEST(Resize, SamePixelsAsOpenCV) {
  GTEST_SKIP() << "OpenCV (libopencv-imgproc-dev) not installed: parity not checked";
}
#endif

}  // namespace
}  // namespace ddp::image
