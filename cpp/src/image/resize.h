// RGB8 resizing: the two filters the transforms use, written to give the same pixels as
// the OpenCV 4.6 resize they replace (cv::resize with INTER_LINEAR and, when shrinking,
// INTER_AREA, on CV_8UC3, Debian 12's build), so that the wheel needs no
// OpenCV and the Loader's output does not change. resize_test.cc checks the equality
// against OpenCV when it is installed, and the arithmetic on small cases by hand.
//
// Bilinear: half-pixel centres, edge pixels repeated, 11-bit fixed-point weights; the
// vertical pass rounds as OpenCV's SIMD path does. Area: each output pixel is the mean of
// the source area it covers, partly covered pixels weighted by the fraction covered.
//
// Resize has SSE2 and AVX2 loops, picked by SimdLevel() (common/simd.h); at the SSSE3
// level it runs the SSE2 ones (that level is the fused output write's, transforms.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace ddp::image {

// A read-only RGB8 view: `stride` bytes between rows (at least 3 * width).
struct Rgb8View {
  const uint8_t* data = nullptr;
  int width = 0;
  int height = 0;
  size_t stride = 0;
};

enum class ResizeFilter { kBilinear, kArea };

// Resizes `src` to out_width x out_height into `out` (rows packed, 3 * out_width bytes),
// growing `out` if needed. Both sizes must be positive; kArea requires shrinking in both
// directions (out_width <= src.width and out_height <= src.height), else bilinear is
// used. The same size copies.
void ResizeRgb8(const Rgb8View& src, int out_width, int out_height, ResizeFilter filter,
                std::vector<uint8_t>& out);

// Receives a resized image row by row: row `y` (3 * out_width bytes, valid only during
// the call), each row once, in increasing order.
using RowSink = std::function<void(int y, const uint8_t* row)>;

// The same pixels as ResizeRgb8, handed to `sink` one row at a time from a small
// per-thread scratch row instead of a whole output image, so a caller can consume each
// row (e.g. convert it to planar float) while it is still in cache.
void ResizeRgb8Rows(const Rgb8View& src, int out_width, int out_height, ResizeFilter filter,
                    const RowSink& sink);

}  // namespace ddp::image
