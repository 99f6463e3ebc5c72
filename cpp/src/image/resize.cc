#include "image/resize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

namespace ddp::image {
namespace {

constexpr int kChannels = 3;
constexpr int kCoefBits = 11;  // OpenCV's INTER_RESIZE_COEF_BITS
constexpr int kCoefScale = 1 << kCoefBits;

// OpenCV's saturate_cast from float/double: round half to even, then clamp.
inline uint8_t RoundToU8(float v) {
  const long r = std::lrint(v);
  return static_cast<uint8_t>(std::clamp(r, 0L, 255L));
}
inline int16_t RoundToI16(float v) {
  return static_cast<int16_t>(std::clamp(std::lrint(v), -32768L, 32767L));
}

// Two taps per output position, with the source offset of the first.
struct LinearTaps {
  std::vector<int> offset;  // first tap: pixel index (x) or row (y); may be clamped
  std::vector<int16_t> w0, w1;
};

// OpenCV's bilinear coordinates (half-pixel centres, computed in float), with the
// weights in 11-bit fixed point. Positions left of the first pixel take it with weight
// one; `last` (if given) is the first output position from which only one tap is read.
LinearTaps Taps(int src, int dst, double scale, int* last) {
  LinearTaps t;
  t.offset.resize(dst);
  t.w0.resize(dst);
  t.w1.resize(dst);
  if (last != nullptr) *last = dst;
  for (int d = 0; d < dst; ++d) {
    float f = static_cast<float>((d + 0.5) * scale - 0.5);
    int s = static_cast<int>(std::floor(f));
    f -= static_cast<float>(s);
    if (last != nullptr) {  // columns: OpenCV clamps the coordinate itself
      if (s < 0) {
        f = 0;
        s = 0;
      }
      if (s + 1 >= src) {
        *last = std::min(*last, d);
        if (s >= src - 1) {
          f = 0;
          s = src - 1;
        }
      }
    }
    t.offset[d] = s;
    t.w0[d] = RoundToI16((1.f - f) * kCoefScale);
    t.w1[d] = RoundToI16(f * kCoefScale);
  }
  return t;
}

// One source row filtered horizontally: 3 * out_width sums in 11-bit fixed point.
void HorizontalLinear(const uint8_t* row, const LinearTaps& x, int last, int out_width, int32_t* out) {
  for (int d = 0; d < last; ++d) {
    const uint8_t* s = row + kChannels * x.offset[d];
    const int32_t a0 = x.w0[d], a1 = x.w1[d];
    for (int c = 0; c < kChannels; ++c) out[kChannels * d + c] = s[c] * a0 + s[c + kChannels] * a1;
  }
  for (int d = last; d < out_width; ++d) {
    const uint8_t* s = row + kChannels * x.offset[d];
    for (int c = 0; c < kChannels; ++c) out[kChannels * d + c] = s[c] * kCoefScale;
  }
}

// Blends two horizontally filtered rows with the rounding of OpenCV's SIMD path (which
// the whole row takes, measured: resize_test.cc): 16-bit multiply-high of the sums shifted
// right by 4, then a rounding shift by 2. Vectorizes as written (pmulhw-like).
void VerticalLinear(const int32_t* r0, const int32_t* r1, int32_t b0, int32_t b1, int n, uint8_t* out) {
  for (int i = 0; i < n; ++i) {
    const int32_t t = (((r0[i] >> 4) * b0) >> 16) + (((r1[i] >> 4) * b1) >> 16);
    out[i] = static_cast<uint8_t>(std::clamp((t + 2) >> 2, 0, 255));
  }
}

void ResizeLinear(const Rgb8View& src, int out_w, int out_h, double scale_x, double scale_y,
                  uint8_t* out) {
  int last = out_w;
  const LinearTaps x = Taps(src.width, out_w, scale_x, &last);
  const LinearTaps y = Taps(src.height, out_h, scale_y, nullptr);
  const int n = kChannels * out_w;
  // Two filtered source rows, reused while consecutive output rows read the same ones.
  thread_local std::vector<int32_t> rows;
  rows.resize(2 * static_cast<size_t>(n));
  int32_t* slot[2] = {rows.data(), rows.data() + n};
  int have[2] = {-1, -1};
  // Rows are read in increasing order; a new row replaces the older one, never `keep`.
  auto row = [&](int sy, const int32_t* keep) -> const int32_t* {
    sy = std::clamp(sy, 0, src.height - 1);
    for (int i = 0; i < 2; ++i) {
      if (have[i] == sy) return slot[i];
    }
    const int i = keep == slot[0] ? 1 : keep == slot[1] ? 0 : (have[0] <= have[1] ? 0 : 1);
    HorizontalLinear(src.data + static_cast<size_t>(sy) * src.stride, x, last, out_w, slot[i]);
    have[i] = sy;
    return slot[i];
  };
  for (int d = 0; d < out_h; ++d) {
    const int32_t* r0 = row(y.offset[d], nullptr);
    const int32_t* r1 = row(y.offset[d] + 1, r0);
    VerticalLinear(r0, r1, y.w0[d], y.w1[d], n, out + static_cast<size_t>(d) * n);
  }
}

// Integer shrink factors: the rounded mean of each block (half to even; 2x2 blocks
// half up, as OpenCV's SIMD path for them rounds).
void ResizeAreaInteger(const Rgb8View& src, int out_w, int out_h, int fx, int fy, uint8_t* out) {
  const float scale = 1.f / static_cast<float>(fx * fy);
  thread_local std::vector<int32_t> sums;
  sums.assign(static_cast<size_t>(kChannels) * out_w, 0);
  for (int d = 0; d < out_h; ++d) {
    std::fill(sums.begin(), sums.end(), 0);
    for (int k = 0; k < fy; ++k) {
      const uint8_t* s = src.data + static_cast<size_t>(d * fy + k) * src.stride;
      for (int dx = 0; dx < out_w; ++dx) {
        const uint8_t* p = s + static_cast<size_t>(kChannels) * dx * fx;
        for (int j = 0; j < fx; ++j) {
          for (int c = 0; c < kChannels; ++c) sums[kChannels * dx + c] += p[kChannels * j + c];
        }
      }
    }
    uint8_t* o = out + static_cast<size_t>(d) * kChannels * out_w;
    if (fx == 2 && fy == 2) {
      for (size_t i = 0; i < sums.size(); ++i) o[i] = static_cast<uint8_t>((sums[i] + 2) >> 2);
    } else {
      for (size_t i = 0; i < sums.size(); ++i) o[i] = RoundToU8(static_cast<float>(sums[i]) * scale);
    }
  }
}

// One source index contributing to one output index with a weight (OpenCV's DecimateAlpha).
struct AreaTap {
  int out, in;
  float weight;
};

// The source cells each output cell covers: whole pixels with weight 1/cell, partly
// covered ones with the covered fraction (a part under 1e-3 of a pixel is dropped).
std::vector<AreaTap> AreaTaps(int src, int dst, double scale) {
  std::vector<AreaTap> tab;
  tab.reserve(2 * static_cast<size_t>(src));
  for (int d = 0; d < dst; ++d) {
    const double f1 = d * scale, f2 = f1 + scale;
    const double cell = std::min(scale, src - f1);
    int s1 = static_cast<int>(std::ceil(f1)), s2 = static_cast<int>(std::floor(f2));
    s2 = std::min(s2, src - 1);
    s1 = std::min(s1, s2);
    if (s1 - f1 > 1e-3) tab.push_back({d, s1 - 1, static_cast<float>((s1 - f1) / cell)});
    for (int s = s1; s < s2; ++s) tab.push_back({d, s, static_cast<float>(1.0 / cell)});
    if (f2 - s2 > 1e-3) {
      tab.push_back({d, s2, static_cast<float>(std::min(std::min(f2 - s2, 1.), cell) / cell)});
    }
  }
  return tab;
}

// Fractional shrink factors, in float as OpenCV does (same operations, same order).
void ResizeAreaFraction(const Rgb8View& src, int out_w, int out_h, double scale_x, double scale_y,
                        uint8_t* out) {
  const std::vector<AreaTap> xtab = AreaTaps(src.width, out_w, scale_x);
  const std::vector<AreaTap> ytab = AreaTaps(src.height, out_h, scale_y);
  const size_t n = static_cast<size_t>(kChannels) * out_w;
  thread_local std::vector<float> buffer;
  buffer.assign(2 * n, 0.f);
  float* buf = buffer.data();
  float* sum = buf + n;
  auto flush = [&](int dy) {
    uint8_t* o = out + static_cast<size_t>(dy) * n;
    for (size_t i = 0; i < n; ++i) o[i] = RoundToU8(sum[i]);
  };
  int prev = ytab.empty() ? 0 : ytab.front().out;
  for (const AreaTap& ty : ytab) {
    const uint8_t* s = src.data + static_cast<size_t>(ty.in) * src.stride;
    std::fill(buf, buf + n, 0.f);
    for (const AreaTap& tx : xtab) {
      const float a = tx.weight;
      float* b = buf + kChannels * tx.out;
      const uint8_t* p = s + kChannels * tx.in;
      for (int c = 0; c < kChannels; ++c) b[c] = b[c] + p[c] * a;
    }
    if (ty.out != prev) {
      flush(prev);
      for (size_t i = 0; i < n; ++i) sum[i] = ty.weight * buf[i];
      prev = ty.out;
    } else {
      for (size_t i = 0; i < n; ++i) sum[i] += ty.weight * buf[i];
    }
  }
  flush(prev);
}

}  // namespace

void ResizeRgb8(const Rgb8View& src, int out_width, int out_height, ResizeFilter filter,
                std::vector<uint8_t>& out) {
  const size_t row = static_cast<size_t>(kChannels) * out_width;
  if (out.size() < row * out_height) out.resize(row * out_height);
  if (src.width == out_width && src.height == out_height) {
    for (int y = 0; y < out_height; ++y) {
      std::memcpy(out.data() + y * row, src.data + static_cast<size_t>(y) * src.stride, row);
    }
    return;
  }
  // The scale as OpenCV derives it (1 / (dst / src)), which decides its integer cases.
  const double scale_x = 1. / (static_cast<double>(out_width) / src.width);
  const double scale_y = 1. / (static_cast<double>(out_height) / src.height);
  const int ix = static_cast<int>(std::lrint(scale_x)), iy = static_cast<int>(std::lrint(scale_y));
  const bool integer = std::abs(scale_x - ix) < DBL_EPSILON && std::abs(scale_y - iy) < DBL_EPSILON;
  // Halving both sides bilinearly is the 2x2 mean; OpenCV takes its area path for it.
  if (filter == ResizeFilter::kBilinear && integer && ix == 2 && iy == 2) filter = ResizeFilter::kArea;
  if (filter == ResizeFilter::kArea && scale_x >= 1 && scale_y >= 1) {
    if (integer) {
      ResizeAreaInteger(src, out_width, out_height, ix, iy, out.data());
    } else {
      ResizeAreaFraction(src, out_width, out_height, scale_x, scale_y, out.data());
    }
    return;
  }
  ResizeLinear(src, out_width, out_height, scale_x, scale_y, out.data());
}

}  // namespace ddp::image
