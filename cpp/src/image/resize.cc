#include "image/resize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // AVX2, used only behind a run-time CPU check
#define DDP_RESIZE_AVX2 1
#endif

#include "common/simd.h"

namespace ddp::image {
namespace {

constexpr int kChannels = 3;

// Where finished output rows go: a packed image (`image`), or one scratch row handed to
// `sink` as each is done.
struct RowWriter {
  uint8_t* image = nullptr;
  size_t row_bytes = 0;
  uint8_t* scratch = nullptr;
  const RowSink* sink = nullptr;
  uint8_t* Begin(int d) const { return image != nullptr ? image + static_cast<size_t>(d) * row_bytes : scratch; }
  void End(int d) const {
    if (image == nullptr) (*sink)(d, scratch);
  }
};
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

// n floats rounded (half to even) and saturated to 0..255, as RoundToU8 does each.
void RoundRowToU8(const float* v, size_t n, uint8_t* out) {
  size_t i = 0;
#if defined(__SSE2__)
  // cvtps2dq rounds as lrint does (the default mode: half to even); the two packs saturate.
  for (; i + 8 <= n; i += 8) {
    const __m128i a = _mm_cvtps_epi32(_mm_loadu_ps(v + i));
    const __m128i b = _mm_cvtps_epi32(_mm_loadu_ps(v + i + 4));
    const __m128i w = _mm_packs_epi32(a, b);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(w, w));
  }
#endif
  for (; i < n; ++i) out[i] = RoundToU8(v[i]);
}

// n bytes as floats.
void BytesToFloat(const uint8_t* b, int n, float* out) {
  int i = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  for (; i + 16 <= n; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i));
    const __m128i lo = _mm_unpacklo_epi8(v, zero), hi = _mm_unpackhi_epi8(v, zero);
    _mm_storeu_ps(out + i, _mm_cvtepi32_ps(_mm_unpacklo_epi16(lo, zero)));
    _mm_storeu_ps(out + i + 4, _mm_cvtepi32_ps(_mm_unpackhi_epi16(lo, zero)));
    _mm_storeu_ps(out + i + 8, _mm_cvtepi32_ps(_mm_unpacklo_epi16(hi, zero)));
    _mm_storeu_ps(out + i + 12, _mm_cvtepi32_ps(_mm_unpackhi_epi16(hi, zero)));
  }
#endif
  for (; i < n; ++i) out[i] = static_cast<float>(b[i]);
}

#if DDP_RESIZE_AVX2
// AccumulateRow's loop 8 values at a time (the same product and sum per value, no FMA).
// Returns where it stopped.
__attribute__((target("avx2"))) size_t AccumulateRowAvx2(const float* v, float w, bool add, size_t n, float* sum) {
  const __m256 vw = _mm256_set1_ps(w);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 p = _mm256_mul_ps(vw, _mm256_loadu_ps(v + i));
    _mm256_storeu_ps(sum + i, add ? _mm256_add_ps(_mm256_loadu_ps(sum + i), p) : p);
  }
  return i;
}
#endif

// sum[i] = w * v[i] (`add` false) or sum[i] += w * v[i]: a product then a sum, rounded
// each, as the scalar expressions are (no fused multiply-add).
void AccumulateRow(const float* v, float w, bool add, size_t n, float* sum) {
  size_t i = 0;
#if DDP_RESIZE_AVX2
  if (SimdLevel() == Simd::kAvx2) i = AccumulateRowAvx2(v, w, add, n, sum);
#endif
#if defined(__SSE2__)
  const __m128 vw = _mm_set1_ps(w);
  for (; i + 4 <= n; i += 4) {
    const __m128 p = _mm_mul_ps(vw, _mm_loadu_ps(v + i));
    _mm_storeu_ps(sum + i, add ? _mm_add_ps(_mm_loadu_ps(sum + i), p) : p);
  }
#endif
  for (; i < n; ++i) sum[i] = add ? sum[i] + w * v[i] : w * v[i];
}

// Two taps per output position, with the source offset of the first.
struct LinearTaps {
  std::vector<int> offset;  // first tap: pixel index (x) or row (y); may be clamped
  std::vector<int16_t> w0, w1;
  // Per position (w0 w1 w0 w1 w0 w1 0 0): the SIMD horizontal pass loads it whole.
  std::vector<int16_t> w8;
  // Columns only: byte offsets of the first taps (3 * offset), and how many positions from
  // the left the AVX2 pass does in pairs: an even count, every pair's 16-byte loads inside
  // the row and both taps read (before `last`). Fixed per resize, not checked per row.
  std::vector<int> byte_offset;
  int pairs_end = 0;
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
  if (last != nullptr) {
    const int row_bytes = kChannels * src;
    t.byte_offset.resize(dst);
    for (int d = 0; d < dst; ++d) t.byte_offset[d] = kChannels * t.offset[d];
    while (t.pairs_end + 1 < *last && t.byte_offset[t.pairs_end + 1] + 16 <= row_bytes) t.pairs_end += 2;
    t.w8.assign(8 * static_cast<size_t>(dst), 0);
    for (int d = 0; d < dst; ++d) {
      for (int c = 0; c < kChannels; ++c) {
        t.w8[8 * static_cast<size_t>(d) + 2 * c] = t.w0[d];
        t.w8[8 * static_cast<size_t>(d) + 2 * c + 1] = t.w1[d];
      }
    }
  }
  return t;
}

#if DDP_RESIZE_AVX2
// Two pixels at positions d and d + 1, one in each 128-bit lane: a byte shuffle puts each
// pixel's two taps side by side (r r' g g' b b' 0 0, widened to 16 bits), then the
// multiply-add with the weights and the shift of the SSE2 loop below; each lane's three
// sums (0..32640, so their low 16 bits are the saturated values) gathered by a second
// shuffle and stored, the second lane straight from the register (16 bytes: `out` has 8
// values of slack).
__attribute__((target("avx2"), always_inline)) inline void HorizontalPairAvx2(const uint8_t* row, const int* offset,
                                                                             const int16_t* w, int d, int16_t* out) {
  const __m256i pairs = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,  //
                                         0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i low16 = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                         0, 1, 4, 5, 8, 9, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i px = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + offset[d]))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + offset[d + 1])), 1);
  const __m256i wd = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 8 * static_cast<size_t>(d)));
  const __m256i sum = _mm256_srai_epi32(_mm256_madd_epi16(_mm256_shuffle_epi8(px, pairs), wd), 4);
  const __m256i v = _mm256_shuffle_epi8(sum, low16);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out + kChannels * d), _mm256_castsi256_si128(v));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + kChannels * (d + 1)), _mm256_extracti128_si256(v, 1));
}

// The first x.pairs_end positions of a row, two pairs per iteration (bounds fixed per
// resize in Taps, none checked here). Returns x.pairs_end.
__attribute__((target("avx2"))) int HorizontalLinearAvx2(const uint8_t* row, const LinearTaps& x, int16_t* out) {
  const int* offset = x.byte_offset.data();
  const int16_t* w = x.w8.data();
  const int end = x.pairs_end;
  int d = 0;
  for (; d + 3 < end; d += 4) {
    HorizontalPairAvx2(row, offset, w, d, out);
    HorizontalPairAvx2(row, offset, w, d + 2, out);
  }
  if (d < end) {
    HorizontalPairAvx2(row, offset, w, d, out);
    d += 2;
  }
  return d;
}
#endif

// One source row filtered horizontally: 3 * out_width sums in 11-bit fixed point, kept
// divided by 16 (the vertical pass uses nothing finer), so that they fit in 16 bits.
// `out` has room for 8 more values (the SIMD loops write past the last pixel).
void HorizontalLinear(const uint8_t* row, int row_bytes, const LinearTaps& x, int last, int out_width,
                      int16_t* out) {
  const int* offset = x.offset.data();
  int d = 0;
#if DDP_RESIZE_AVX2
  // AVX2 does pairs of pixels; the rest goes one at a time below. (An SSSE3 loop with one
  // byte shuffle per pixel measured no faster than this SSE2 one, so there is none.)
  if (SimdLevel() == Simd::kAvx2) d = HorizontalLinearAvx2(row, x, out);
#endif
#if defined(__SSE2__)
  // Per pixel: the two 4-byte groups at the taps interleaved (r r' g g' b b' . .), widened
  // to 16 bits and multiplied-added with (w0 w1 w0 w1 w0 w1 0 0): OpenCV's dot product.
  const __m128i* w = reinterpret_cast<const __m128i*>(x.w8.data());
  const __m128i zero = _mm_setzero_si128();
  for (; d < last; ++d) {
    const int o = kChannels * offset[d];
    if (o + kChannels + 4 > row_bytes) break;  // offsets only grow: the rest is scalar
    int32_t a = 0, b = 0;
    std::memcpy(&a, row + o, 4);
    std::memcpy(&b, row + o + kChannels, 4);
    const __m128i ab = _mm_unpacklo_epi8(_mm_unpacklo_epi8(_mm_cvtsi32_si128(a), _mm_cvtsi32_si128(b)), zero);
    const __m128i sum = _mm_srai_epi32(_mm_madd_epi16(ab, _mm_loadu_si128(w + d)), 4);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + kChannels * d), _mm_packs_epi32(sum, sum));
  }
#endif
  const int16_t* w0 = x.w0.data();
  const int16_t* w1 = x.w1.data();
  for (; d < last; ++d) {
    const uint8_t* s = row + kChannels * offset[d];
    const int32_t a0 = w0[d], a1 = w1[d];
    const int32_t s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3], s4 = s[4], s5 = s[5];
    int16_t* o = out + kChannels * d;
    o[0] = static_cast<int16_t>((s0 * a0 + s3 * a1) >> 4);
    o[1] = static_cast<int16_t>((s1 * a0 + s4 * a1) >> 4);
    o[2] = static_cast<int16_t>((s2 * a0 + s5 * a1) >> 4);
  }
  // Past `last` (the right edge) one tap with weight one.
  for (; d < out_width; ++d) {
    const uint8_t* s = row + kChannels * offset[d];
    for (int c = 0; c < kChannels; ++c) out[kChannels * d + c] = static_cast<int16_t>(s[c] * (kCoefScale >> 4));
  }
}

#if DDP_RESIZE_AVX2
// VerticalLinear's SSE2 loop 16 values at a time (the same operations per value); the
// pack works per 128-bit lane, so a permute brings both lanes' 8 bytes together. Returns
// where it stopped.
__attribute__((target("avx2"))) int VerticalLinearAvx2(const int16_t* r0, const int16_t* r1, int16_t b0, int16_t b1,
                                                       int n, uint8_t* out) {
  const __m256i vb0 = _mm256_set1_epi16(b0), vb1 = _mm256_set1_epi16(b1), two = _mm256_set1_epi16(2);
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + i));
    const __m256i h = _mm256_add_epi16(_mm256_mulhi_epi16(a, vb0), _mm256_mulhi_epi16(b, vb1));
    const __m256i v = _mm256_srai_epi16(_mm256_add_epi16(h, two), 2);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(v, v), 0x08);  // qwords 0, 2
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
  return i;
}
#endif

// Blends two horizontally filtered rows with the rounding of OpenCV's SIMD path (which
// the whole row takes, measured: resize_test.cc): the 16-bit multiply-high of each row
// and its weight, summed, then a rounding shift by 2 (SSE2 where there is SSE2).
void VerticalLinear(const int16_t* r0, const int16_t* r1, int16_t b0, int16_t b1, int n, uint8_t* out) {
  int i = 0;
#if DDP_RESIZE_AVX2
  if (SimdLevel() == Simd::kAvx2) i = VerticalLinearAvx2(r0, r1, b0, b1, n, out);
#endif
#if defined(__SSE2__)
  const __m128i vb0 = _mm_set1_epi16(b0), vb1 = _mm_set1_epi16(b1), two = _mm_set1_epi16(2);
  for (; i + 8 <= n; i += 8) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0 + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1 + i));
    const __m128i h = _mm_add_epi16(_mm_mulhi_epi16(a, vb0), _mm_mulhi_epi16(b, vb1));
    const __m128i v = _mm_srai_epi16(_mm_add_epi16(h, two), 2);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(v, v));
  }
#endif
  for (; i < n; ++i) {
    const int16_t h0 = static_cast<int16_t>((static_cast<int32_t>(r0[i]) * b0) >> 16);
    const int16_t h1 = static_cast<int16_t>((static_cast<int32_t>(r1[i]) * b1) >> 16);
    const int v = (h0 + h1 + 2) >> 2;
    out[i] = static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
  }
}

void ResizeLinear(const Rgb8View& src, int out_w, int out_h, double scale_x, double scale_y,
                  const RowWriter& out) {
  int last = out_w;
  const LinearTaps x = Taps(src.width, out_w, scale_x, &last);
  const LinearTaps y = Taps(src.height, out_h, scale_y, nullptr);
  const int n = kChannels * out_w;
  // Two filtered source rows, reused while consecutive output rows read the same ones.
  thread_local std::vector<int16_t> rows;
  rows.resize(2 * (static_cast<size_t>(n) + 8));
  int16_t* slot[2] = {rows.data(), rows.data() + n + 8};
  int have[2] = {-1, -1};
  // Rows are read in increasing order; a new row replaces the older one, never `keep`.
  auto row = [&](int sy, const int16_t* keep) -> const int16_t* {
    sy = std::clamp(sy, 0, src.height - 1);
    for (int i = 0; i < 2; ++i) {
      if (have[i] == sy) return slot[i];
    }
    const int i = keep == slot[0] ? 1 : keep == slot[1] ? 0 : (have[0] <= have[1] ? 0 : 1);
    HorizontalLinear(src.data + static_cast<size_t>(sy) * src.stride, kChannels * src.width, x, last, out_w,
                     slot[i]);
    have[i] = sy;
    return slot[i];
  };
  for (int d = 0; d < out_h; ++d) {
    const int16_t* r0 = row(y.offset[d], nullptr);
    const int16_t* r1 = row(y.offset[d] + 1, r0);
    VerticalLinear(r0, r1, y.w0[d], y.w1[d], n, out.Begin(d));
    out.End(d);
  }
}

// Integer shrink factors: the rounded mean of each block (half to even; 2x2 blocks
// half up, as OpenCV's SIMD path for them rounds).
void ResizeAreaInteger(const Rgb8View& src, int out_w, int out_h, int fx, int fy, const RowWriter& out) {
  const size_t n = static_cast<size_t>(kChannels) * out_w;
  if (fx == 2 && fy == 2) {
    for (int d = 0; d < out_h; ++d) {
      const uint8_t* a = src.data + static_cast<size_t>(2 * d) * src.stride;
      const uint8_t* b = a + src.stride;
      uint8_t* o = out.Begin(d);
      for (int dx = 0; dx < out_w; ++dx, a += 6, b += 6, o += 3) {
        for (int c = 0; c < kChannels; ++c) {
          o[c] = static_cast<uint8_t>((a[c] + a[c + 3] + b[c] + b[c + 3] + 2) >> 2);
        }
      }
      out.End(d);
    }
    return;
  }
  const float scale = 1.f / static_cast<float>(fx * fy);
  thread_local std::vector<int32_t> sums;
  sums.resize(n);
  thread_local std::vector<float> scaled;
  scaled.resize(n);
  for (int d = 0; d < out_h; ++d) {
    // Sum the block's rows first (vectorizes), then each pixel's fx columns.
    std::fill(sums.begin(), sums.end(), 0);
    thread_local std::vector<int32_t> cols;
    cols.assign(static_cast<size_t>(kChannels) * out_w * fx, 0);
    for (int k = 0; k < fy; ++k) {
      const uint8_t* s = src.data + static_cast<size_t>(d * fy + k) * src.stride;
      for (size_t i = 0; i < cols.size(); ++i) cols[i] += s[i];
    }
    for (int dx = 0; dx < out_w; ++dx) {
      const int32_t* p = cols.data() + static_cast<size_t>(kChannels) * dx * fx;
      for (int j = 0; j < fx; ++j) {
        for (int c = 0; c < kChannels; ++c) sums[kChannels * dx + c] += p[kChannels * j + c];
      }
    }
    for (size_t i = 0; i < n; ++i) scaled[i] = static_cast<float>(sums[i]) * scale;
    RoundRowToU8(scaled.data(), n, out.Begin(d));
    out.End(d);
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

#if DDP_RESIZE_AVX2
// The area filter's horizontal pass two output pixels per step, one in each 128-bit lane:
// per lane the products and sums of the SSE2 loop in ResizeAreaFraction, in the same
// order. `at` and `w` are its tap tables (`taps` per pixel); each pixel's 4-float store
// spills one value into the next pixel, which its own store then overwrites. Returns the
// pixels done (an even count).
__attribute__((target("avx2"))) int AreaRowAvx2(const float* f, const int* at, const float* w, int taps, int out_w,
                                                float* buf) {
  int d = 0;
  for (; d + 1 < out_w; d += 2) {
    const int* a0 = at + static_cast<size_t>(d) * taps;
    const int* a1 = a0 + taps;
    const float* w0 = w + static_cast<size_t>(d) * taps;
    const float* w1 = w0 + taps;
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < taps; ++j) {
      const __m256 p = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(f + a0[j])), _mm_loadu_ps(f + a1[j]), 1);
      const __m256 wj = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(w0[j])), _mm_set1_ps(w1[j]), 1);
      acc = _mm256_add_ps(acc, _mm256_mul_ps(p, wj));
    }
    _mm_storeu_ps(buf + kChannels * d, _mm256_castps256_ps128(acc));
    _mm_storeu_ps(buf + kChannels * (d + 1), _mm256_extractf128_ps(acc, 1));
  }
  return d;
}
#endif

// Fractional shrink factors, in float as OpenCV does (same operations, same order).
void ResizeAreaFraction(const Rgb8View& src, int out_w, int out_h, double scale_x, double scale_y,
                        const RowWriter& out) {
  const std::vector<AreaTap> xtab = AreaTaps(src.width, out_w, scale_x);
  const std::vector<AreaTap> ytab = AreaTaps(src.height, out_h, scale_y);
  const size_t n = static_cast<size_t>(kChannels) * out_w;
  thread_local std::vector<float> buffer;
  buffer.assign(2 * n + 1, 0.f);
  float* buf = buffer.data();  // n values and one more the SIMD store may write
  float* sum = buf + n + 1;
  auto flush = [&](int dy) {
    RoundRowToU8(sum, n, out.Begin(dy));
    out.End(dy);
  };
  // xtab is ordered by output pixel: each pixel's taps are one run.
  std::vector<int> xrun(static_cast<size_t>(out_w) + 1, 0);
  for (const AreaTap& t : xtab) ++xrun[t.out + 1];
  for (int d = 0; d < out_w; ++d) xrun[d + 1] += xrun[d];
#if defined(__SSE2__)
  // Every pixel gets the same number of taps (the most any has), the missing ones with
  // weight zero at its last tap: adding p * 0 = +0 to a sum of non-negative terms leaves it
  // unchanged, so the sums are the same, and the tap loop is one plain loop over a table.
  int taps = 0;
  for (int d = 0; d < out_w; ++d) taps = std::max(taps, xrun[d + 1] - xrun[d]);
  thread_local std::vector<int> tap_at;
  thread_local std::vector<float> tap_w;
  tap_at.assign(static_cast<size_t>(out_w) * taps, 0);
  tap_w.assign(static_cast<size_t>(out_w) * taps, 0.f);
  for (int d = 0; d < out_w; ++d) {
    for (int j = 0; j < taps; ++j) {
      const int k = std::min(xrun[d] + j, xrun[d + 1] - 1);
      const size_t at = static_cast<size_t>(d) * taps + j;
      if (k < xrun[d]) continue;  // no taps at all: zeros
      tap_at[at] = kChannels * xtab[k].in;
      if (xrun[d] + j < xrun[d + 1]) tap_w[at] = xtab[k].weight;
    }
  }
  // Each source row converted to float once (one spare value: a pixel is read as 4).
  thread_local std::vector<float> rowf;
  rowf.assign(static_cast<size_t>(kChannels) * src.width + 1, 0.f);
#endif
  int prev = ytab.empty() ? 0 : ytab.front().out;
  int filtered = -1;  // the source row `buf` holds
  for (const AreaTap& ty : ytab) {
    const uint8_t* s = src.data + static_cast<size_t>(ty.in) * src.stride;
    // A row split between two output rows comes twice in a row: filter it once.
    if (ty.in != filtered) {
      filtered = ty.in;
#if defined(__SSE2__)
      // A pixel's three channels in one register: the same products and sums, in the same
      // order, per lane.
      BytesToFloat(s, kChannels * src.width, rowf.data());
      const float* f = rowf.data();
      int d = 0;
#if DDP_RESIZE_AVX2
      if (SimdLevel() == Simd::kAvx2) d = AreaRowAvx2(f, tap_at.data(), tap_w.data(), taps, out_w, buf);
#endif
      const int* at = tap_at.data() + static_cast<size_t>(d) * taps;
      const float* w = tap_w.data() + static_cast<size_t>(d) * taps;
      for (; d < out_w; ++d, at += taps, w += taps) {
        __m128 acc = _mm_setzero_ps();
        for (int j = 0; j < taps; ++j) acc = _mm_add_ps(acc, _mm_mul_ps(_mm_loadu_ps(f + at[j]), _mm_set1_ps(w[j])));
        _mm_storeu_ps(buf + kChannels * d, acc);
      }
#else
      // Each pixel's sum in registers, added in the taps' order (the same float result
      // as accumulating in memory).
      for (int d = 0; d < out_w; ++d) {
        float a0 = 0.f, a1 = 0.f, a2 = 0.f;
        for (int k = xrun[d]; k < xrun[d + 1]; ++k) {
          const uint8_t* p = s + kChannels * xtab[k].in;
          const float w = xtab[k].weight;
          a0 = a0 + p[0] * w;
          a1 = a1 + p[1] * w;
          a2 = a2 + p[2] * w;
        }
        buf[kChannels * d] = a0;
        buf[kChannels * d + 1] = a1;
        buf[kChannels * d + 2] = a2;
      }
#endif
    }
    if (ty.out != prev) {
      flush(prev);
      AccumulateRow(buf, ty.weight, false, n, sum);
      prev = ty.out;
    } else {
      AccumulateRow(buf, ty.weight, true, n, sum);
    }
  }
  flush(prev);
}

// Both entry points: same-size copies aside, the filters write through `out`.
void Resize(const Rgb8View& src, int out_width, int out_height, ResizeFilter filter, const RowWriter& out) {
  // The scale as OpenCV derives it (1 / (dst / src)), which decides its integer cases.
  const double scale_x = 1. / (static_cast<double>(out_width) / src.width);
  const double scale_y = 1. / (static_cast<double>(out_height) / src.height);
  const int ix = static_cast<int>(std::lrint(scale_x)), iy = static_cast<int>(std::lrint(scale_y));
  const bool integer = std::abs(scale_x - ix) < DBL_EPSILON && std::abs(scale_y - iy) < DBL_EPSILON;
  // Halving both sides bilinearly is the 2x2 mean; OpenCV takes its area path for it.
  if (filter == ResizeFilter::kBilinear && integer && ix == 2 && iy == 2) filter = ResizeFilter::kArea;
  if (filter == ResizeFilter::kArea && scale_x >= 1 && scale_y >= 1) {
    if (integer) {
      ResizeAreaInteger(src, out_width, out_height, ix, iy, out);
    } else {
      ResizeAreaFraction(src, out_width, out_height, scale_x, scale_y, out);
    }
    return;
  }
  ResizeLinear(src, out_width, out_height, scale_x, scale_y, out);
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
  Resize(src, out_width, out_height, filter, RowWriter{out.data(), row, nullptr, nullptr});
}

void ResizeRgb8Rows(const Rgb8View& src, int out_width, int out_height, ResizeFilter filter,
                    const RowSink& sink) {
  if (src.width == out_width && src.height == out_height) {
    for (int y = 0; y < out_height; ++y) sink(y, src.data + static_cast<size_t>(y) * src.stride);
    return;
  }
  const size_t row = static_cast<size_t>(kChannels) * out_width;
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < row) scratch.resize(row);
  Resize(src, out_width, out_height, filter, RowWriter{nullptr, row, scratch.data(), &sink});
}

}  // namespace ddp::image
