#include "image/transforms.h"

#include <algorithm>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>  // SSSE3 and AVX2, used only behind a run-time CPU check
#define DDP_TRANSFORMS_SSSE3 1
#endif

#include "common/simd.h"
#include "image/resize.h"

namespace ddp::image {
namespace {

bool IsGeometric(OpKind k) {
  return k == OpKind::kResize || k == OpKind::kCenterCrop || k == OpKind::kRandomResizedCrop;
}

// Python's int(round(x)) for the small values here: round half to even.
int RoundHalfEven(double x) { return static_cast<int>(std::nearbyint(x)); }

// Standing in for torchvision's (PIL) antialiased bilinear resize; upscaling and
// antialias=False are plain bilinear (image/resize.h: the pixels of OpenCV's resize).
// Antialiased shrinking by 2x or more uses the area filter (closest to PIL's widened
// bilinear filter, but its non-integer path costs ~3x a bilinear resize); below 2x a
// bilinear kernel already touches every source pixel a destination pixel covers, and the
// difference from PIL is ~1-3 levels (measured in tests/test_data_transforms.py).
constexpr double kAreaFromFactor = 2.0;

ResizeFilter FilterFor(const Rgb8View& src, int h, int w, bool antialias) {
  const bool down = w <= src.width && h <= src.height;
  const double factor = std::max(static_cast<double>(src.width) / w, static_cast<double>(src.height) / h);
  const bool area = antialias && down && factor >= kAreaFromFactor;
  return area ? ResizeFilter::kArea : ResizeFilter::kBilinear;
}

void ResizeTo(const Rgb8View& src, std::vector<uint8_t>& dst, int h, int w, bool antialias) {
  ResizeRgb8(src, w, h, FilterFor(src, h, w, antialias), dst);
}

// n values px * m + a (float32: the product rounded, then the sum, as the scalar
// expression does; SSE2 has no fused multiply-add, so the values are the same).
void ToFloat(const uint8_t* px, int n, float m, float a, float* out) {
  int x = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  const __m128 vm = _mm_set1_ps(m), va = _mm_set1_ps(a);
  for (; x + 16 <= n; x += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(px + x));
    const __m128i lo = _mm_unpacklo_epi8(b, zero), hi = _mm_unpackhi_epi8(b, zero);
    const __m128i q[4] = {_mm_unpacklo_epi16(lo, zero), _mm_unpackhi_epi16(lo, zero),
                          _mm_unpacklo_epi16(hi, zero), _mm_unpackhi_epi16(hi, zero)};
    for (int k = 0; k < 4; ++k) {
      _mm_storeu_ps(out + x + 4 * k, _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(q[k]), vm), va));
    }
  }
#endif
  for (; x < n; ++x) out[x] = static_cast<float>(px[x]) * m + a;
}

#if DDP_TRANSFORMS_SSSE3
// The 16 RGB pixels at `s` split into three planes of 16 bytes (mirrored when kFlip): each
// plane's bytes picked from the three 16-byte loads by byte shuffles (-1: none from that
// load) and or-ed together.
template <bool kFlip>
__attribute__((target("ssse3"), always_inline)) inline void SplitPlanes(const uint8_t* s, __m128i v[3]) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
  const __m128i r = _mm_or_si128(
      _mm_or_si128(_mm_shuffle_epi8(a, _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)),
                   _mm_shuffle_epi8(b, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1))),
      _mm_shuffle_epi8(c, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13)));
  const __m128i g = _mm_or_si128(
      _mm_or_si128(_mm_shuffle_epi8(a, _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)),
                   _mm_shuffle_epi8(b, _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1))),
      _mm_shuffle_epi8(c, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14)));
  const __m128i bl = _mm_or_si128(
      _mm_or_si128(_mm_shuffle_epi8(a, _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)),
                   _mm_shuffle_epi8(b, _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1))),
      _mm_shuffle_epi8(c, _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15)));
  if constexpr (kFlip) {
    const __m128i reverse = _mm_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    v[0] = _mm_shuffle_epi8(r, reverse);
    v[1] = _mm_shuffle_epi8(g, reverse);
    v[2] = _mm_shuffle_epi8(bl, reverse);
  } else {
    v[0] = r;
    v[1] = g;
    v[2] = bl;
  }
}

// The first 16 * floor(out_w / 16) pixels of a row with SSSE3: each block of 16 RGB
// pixels split into planes (SplitPlanes), then stored as uint8 or converted to float
// (px * m + a, as ToFloat: a product, then a sum). Flip and output type are template
// arguments so the block loop has no branch. Returns how many output pixels it wrote;
// WriteRow does the rest.
template <bool kFlip, bool kFloat>
__attribute__((target("ssse3"))) int WriteRowSsse3(const uint8_t* row, int out_w, const float* mul, const float* add,
                                                   uint8_t* const u8[3], float* const f32[3]) {
  const __m128i zero = _mm_setzero_si128();
  __m128 m[3], ad[3];
  for (int ch = 0; ch < 3; ++ch) {
    m[ch] = _mm_set1_ps(mul[ch]);
    ad[ch] = _mm_set1_ps(add[ch]);
  }
  const int blocks = out_w / 16;
  for (int k = 0; k < blocks; ++k) {
    const int x = 16 * k;                       // first output pixel of the block
    const int sx = kFlip ? out_w - 16 - x : x;  // first source pixel of the block
    __m128i v[3];
    SplitPlanes<kFlip>(row + 3 * static_cast<size_t>(sx), v);
#pragma GCC unroll 3
    for (int ch = 0; ch < 3; ++ch) {
      if constexpr (!kFloat) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(u8[ch] + x), v[ch]);
      } else {
        const __m128i lo = _mm_unpacklo_epi8(v[ch], zero), hi = _mm_unpackhi_epi8(v[ch], zero);
        float* o = f32[ch] + x;
        _mm_storeu_ps(o, _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_unpacklo_epi16(lo, zero)), m[ch]), ad[ch]));
        _mm_storeu_ps(o + 4, _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_unpackhi_epi16(lo, zero)), m[ch]), ad[ch]));
        _mm_storeu_ps(o + 8, _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_unpacklo_epi16(hi, zero)), m[ch]), ad[ch]));
        _mm_storeu_ps(o + 12, _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(_mm_unpackhi_epi16(hi, zero)), m[ch]), ad[ch]));
      }
    }
  }
  return 16 * blocks;
}

// WriteRowSsse3's float output with AVX2: the same planes, widened 8 at a time
// (vpmovzxbd) and converted, multiplied and added in 8-float registers. A product then a
// sum, never fused (no FMA), so the values are the SSE2 and scalar ones.
template <bool kFlip>
__attribute__((target("avx2"))) int WriteRowFloatAvx2(const uint8_t* row, int out_w, const float* mul,
                                                      const float* add, float* const f32[3]) {
  __m256 m[3], ad[3];
  for (int ch = 0; ch < 3; ++ch) {
    m[ch] = _mm256_set1_ps(mul[ch]);
    ad[ch] = _mm256_set1_ps(add[ch]);
  }
  const int blocks = out_w / 16;
  for (int k = 0; k < blocks; ++k) {
    const int x = 16 * k;
    const int sx = kFlip ? out_w - 16 - x : x;
    __m128i v[3];
    SplitPlanes<kFlip>(row + 3 * static_cast<size_t>(sx), v);
#pragma GCC unroll 3
    for (int ch = 0; ch < 3; ++ch) {
      const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v[ch]));
      const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(v[ch], v[ch])));
      _mm256_storeu_ps(f32[ch] + x, _mm256_add_ps(_mm256_mul_ps(lo, m[ch]), ad[ch]));
      _mm256_storeu_ps(f32[ch] + x + 8, _mm256_add_ps(_mm256_mul_ps(hi, m[ch]), ad[ch]));
    }
  }
  return 16 * blocks;
}

// The SIMD part of WriteRow at the best level this CPU runs: pixels written.
int WriteRowSimd(const uint8_t* row, int out_w, bool flip, bool float_out, const float* mul, const float* add,
                 uint8_t* const u8[3], float* const f32[3]) {
  const Simd level = SimdLevel();
  if (level < Simd::kSsse3) return 0;
  if (float_out && level >= Simd::kAvx2) {
    return flip ? WriteRowFloatAvx2<true>(row, out_w, mul, add, f32)
                : WriteRowFloatAvx2<false>(row, out_w, mul, add, f32);
  }
  if (float_out) {
    return flip ? WriteRowSsse3<true, true>(row, out_w, mul, add, u8, f32)
                : WriteRowSsse3<false, true>(row, out_w, mul, add, u8, f32);
  }
  return flip ? WriteRowSsse3<true, false>(row, out_w, mul, add, u8, f32)
              : WriteRowSsse3<false, false>(row, out_w, mul, add, u8, f32);
}
#endif

// One HWC RGB8 row of the output written as row `y` of the three CHW planes of `out`
// (mirrored when `flip`): float32 px * mul + add, or uint8 unchanged. The last step of
// every sample; each output value is written once. The row is split into planes first
// (uint8: straight into the output), then converted a plane at a time.
void WriteRow(const uint8_t* row, int y, int out_h, int out_w, bool flip, bool float_out,
              const std::array<float, 3>& mul, const std::array<float, 3>& add, void* out) {
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  const size_t at = static_cast<size_t>(y) * out_w;
  int done = 0;
#if DDP_TRANSFORMS_SSSE3
  if (float_out) {
    float* const f32[3] = {static_cast<float*>(out) + at, static_cast<float*>(out) + plane + at,
                           static_cast<float*>(out) + 2 * plane + at};
    done = WriteRowSimd(row, out_w, flip, true, mul.data(), add.data(), nullptr, f32);
  } else {
    uint8_t* const u8[3] = {static_cast<uint8_t*>(out) + at, static_cast<uint8_t*>(out) + plane + at,
                            static_cast<uint8_t*>(out) + 2 * plane + at};
    done = WriteRowSimd(row, out_w, flip, false, mul.data(), add.data(), u8, nullptr);
  }
  if (done == out_w) return;
#endif
  // The rest (all of it without SSSE3): output pixels done..out_w-1.
  const int rest = out_w - done;
  thread_local std::vector<uint8_t> split;
  uint8_t* p[3];
  if (float_out) {
    if (split.size() < static_cast<size_t>(3) * rest) split.resize(static_cast<size_t>(3) * rest);
    for (int c = 0; c < 3; ++c) p[c] = split.data() + static_cast<size_t>(c) * rest;
  } else {
    for (int c = 0; c < 3; ++c) p[c] = static_cast<uint8_t*>(out) + c * plane + at + done;
  }
  uint8_t* p0 = p[0];
  uint8_t* p1 = p[1];
  uint8_t* p2 = p[2];
  if (flip) {
    for (int x = 0; x < rest; ++x) {
      const uint8_t* s = row + 3 * static_cast<size_t>(out_w - 1 - done - x);
      p0[x] = s[0];
      p1[x] = s[1];
      p2[x] = s[2];
    }
  } else {
    for (int x = 0; x < rest; ++x) {
      const uint8_t* s = row + 3 * static_cast<size_t>(done + x);
      p0[x] = s[0];
      p1[x] = s[1];
      p2[x] = s[2];
    }
  }
  if (!float_out) return;
  for (int c = 0; c < 3; ++c) {
    ToFloat(p[c], rest, mul[c], add[c], static_cast<float*>(out) + c * plane + at + done);
  }
}

// A view of a packed buffer of `w` x `h` RGB8 pixels.
Rgb8View Packed(const std::vector<uint8_t>& buf, int w, int h) {
  return {buf.data(), w, h, static_cast<size_t>(3) * w};
}

}  // namespace

std::array<int, 2> ResizeShorterSide(int width, int height, int size) {
  const int short_side = std::min(width, height), long_side = std::max(width, height);
  const int new_long = static_cast<int>(static_cast<double>(size) * long_side / short_side);
  if (width <= height) return {new_long, size};
  return {size, new_long};
}

Result<Pipeline> Pipeline::Create(std::vector<TransformOp> ops, bool fixed_size) {
  Pipeline p;
  bool sized = false, to_tensor = false, pil_to_tensor = false;
  for (const TransformOp& op : ops) {
    switch (op.kind) {
      case OpKind::kResize:
        if (op.width <= 0 || op.height < 0) {
          return InvalidArgumentError("Resize: size must be positive, got " +
                                      std::to_string(op.height) + "x" + std::to_string(op.width));
        }
        sized = op.height > 0;
        p.out_h_ = op.height;
        p.out_w_ = op.width;
        break;
      case OpKind::kCenterCrop:
      case OpKind::kRandomResizedCrop:
        if (op.width <= 0 || op.height <= 0) {
          return InvalidArgumentError("crop size must be positive, got " + std::to_string(op.height) +
                                      "x" + std::to_string(op.width));
        }
        if (op.kind == OpKind::kRandomResizedCrop &&
            (op.scale[0] <= 0 || op.scale[0] > op.scale[1] || op.ratio[0] <= 0 || op.ratio[1] <= 0)) {
          return InvalidArgumentError("RandomResizedCrop: need 0 < scale[0] <= scale[1] and ratio > 0");
        }
        sized = true;
        p.out_h_ = op.height;
        p.out_w_ = op.width;
        break;
      case OpKind::kHorizontalFlip:
        if (op.p < 0 || op.p > 1) return InvalidArgumentError("RandomHorizontalFlip: p must be in [0, 1]");
        break;
      case OpKind::kToTensor:
      case OpKind::kPILToTensor:
        if (to_tensor || pil_to_tensor) return InvalidArgumentError("ToTensor/PILToTensor given twice");
        (op.kind == OpKind::kToTensor ? to_tensor : pil_to_tensor) = true;
        break;
      case OpKind::kNormalize:
        if (!to_tensor) return InvalidArgumentError("Normalize needs ToTensor() before it (float input)");
        for (int c = 0; c < 3; ++c) {
          if (op.std[c] == 0) return InvalidArgumentError("Normalize: std must not be 0");
          // Compose with what came before: x -> (x - mean) / std.
          p.mul_[c] = static_cast<float>(p.mul_[c] / op.std[c]);
          p.add_[c] = static_cast<float>((p.add_[c] - op.mean[c]) / op.std[c]);
        }
        break;
    }
    if (op.kind == OpKind::kToTensor) {
      for (int c = 0; c < 3; ++c) p.mul_[c] = 1.0f / 255.0f;
    }
  }
  if (!sized && !fixed_size) {
    p.out_h_ = p.out_w_ = 0;
  } else if (!sized) {
    return InvalidArgumentError(
        "the transform's output size depends on the image; end the geometric transforms with "
        "CenterCrop, RandomResizedCrop or Resize((h, w)) so every batch has one shape");
  }
  if (!to_tensor && !pil_to_tensor) {
    return InvalidArgumentError(
        "the transform must contain ToTensor() (float32 output) or PILToTensor() (uint8 output)");
  }
  p.float_out_ = to_tensor;
  p.ops_ = std::move(ops);
  return p;
}

size_t Pipeline::sample_bytes() const { return sample_bytes(out_h_, out_w_); }

size_t Pipeline::sample_bytes(int height, int width) const {
  return static_cast<size_t>(3) * height * width * (float_out_ ? sizeof(float) : 1);
}

std::array<int, 2> Pipeline::OutputSize(int src_width, int src_height) const {
  int w = src_width, h = src_height;
  for (const TransformOp& op : ops_) {
    if (!IsGeometric(op.kind)) continue;
    if (op.kind == OpKind::kResize && op.height == 0) {
      const auto s = ResizeShorterSide(w, h, op.width);
      h = s[0];
      w = s[1];
    } else {
      h = op.height;
      w = op.width;
    }
  }
  return {h, w};
}

SamplePlan Pipeline::Plan(int src_width, int src_height, Rng& rng, bool allow_scaled_decode,
                          bool allow_region_decode) const {
  SamplePlan plan;
  plan.src_width = src_width;
  plan.src_height = src_height;
  int w = src_width, h = src_height;
  bool first = true;
  bool flip_before = false;
  for (const TransformOp& op : ops_) {
    if (op.kind == OpKind::kHorizontalFlip) {
      plan.flips.push_back(rng.Uniform() < op.p);
      flip_before = flip_before || first;
      continue;
    }
    if (!IsGeometric(op.kind)) continue;
    int nh = op.height, nw = op.width;
    double region_w = w, region_h = h;
    if (op.kind == OpKind::kResize && op.height == 0) {
      const auto s = ResizeShorterSide(w, h, op.width);
      nh = s[0];
      nw = s[1];
    } else if (op.kind == OpKind::kRandomResizedCrop) {
      const Box b = RandomResizedCropBox(w, h, op.scale, op.ratio, [&rng] { return rng.Uniform(); });
      plan.boxes.push_back(b);
      region_w = b.width;
      region_h = b.height;
      // A flip before the crop mirrors the box; keep it simple and decode everything then.
      if (first && allow_region_decode && !flip_before) plan.region = Region{b.left, b.top, b.width, b.height};
    } else if (op.kind == OpKind::kCenterCrop && first && allow_region_decode && !flip_before &&
               nw <= w && nh <= h) {
      plan.region = Region{RoundHalfEven((w - nw) / 2.0), RoundHalfEven((h - nh) / 2.0), nw, nh};
    }
    if (first && allow_scaled_decode && op.antialias && op.kind != OpKind::kCenterCrop) {
      // The coarsest DCT scale whose decoded region is still no smaller than the output.
      const double f = std::min(region_w / nw, region_h / nh);
      for (int d : {8, 4, 2}) {
        if (f >= d) {
          plan.scale_denom = d;
          break;
        }
      }
    }
    first = false;
    w = nw;
    h = nh;
  }
  return plan;
}

Status Pipeline::Apply(const Image& img, const SamplePlan& plan, void* out) const {
  thread_local std::vector<uint8_t> buf[2];
  int which = 0;
  Rgb8View cur{img.pixels.data(), img.width, img.height, static_cast<size_t>(3) * img.width};
  // Only the first geometric op can see a DCT-scaled or partial image; map its
  // full-resolution coordinates into the decoded pixels.
  const int full_w = img.full_width > 0 ? img.full_width : img.width;
  const int full_h = img.full_height > 0 ? img.full_height : img.height;
  double sx = static_cast<double>(full_w) / plan.src_width;
  double sy = static_cast<double>(full_h) / plan.src_height;
  int ox = img.offset_x, oy = img.offset_y;
  const bool partial = img.width != full_w || img.height != full_h;
  int w = plan.src_width, h = plan.src_height;  // planned (full-resolution) size of `cur`
  bool flipped = false;
  bool first_geom = true;
  size_t box_i = 0, flip_i = 0;
  // The last geometric op, when it resizes, writes the output itself (fused: see Fuse).
  size_t last_geom = ops_.size();
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (IsGeometric(ops_[i].kind)) last_geom = i;
  }
  // Plain variables, not a structured binding: the lambda below captures them, which
  // clang before 16 rejects for bindings (the fuzz build uses clang).
  const std::array<int, 2> out_size = OutputSize(plan.src_width, plan.src_height);
  const int out_h = out_size[0];
  const int out_w = out_size[1];
  // Resizes `src` to the output size and writes each row straight into `out` as CHW,
  // with the flips still pending after this op applied (no intermediate image).
  auto fuse = [&](const Rgb8View& src, int nh, int nw, bool antialias) -> Status {
    if (nh != out_h || nw != out_w) {
      return InternalError("transform produced " + std::to_string(nh) + "x" + std::to_string(nw) +
                           ", declared " + std::to_string(out_h) + "x" + std::to_string(out_w));
    }
    bool flip = flipped;
    if (plan.flips.size() < flip_i) return InternalError("transform plan has too few flips");
    for (size_t f = flip_i; f < plan.flips.size(); ++f) flip = flip != plan.flips[f];
    ResizeRgb8Rows(src, nw, nh, FilterFor(src, nh, nw, antialias), [&](int y, const uint8_t* row) {
      WriteRow(row, y, out_h, out_w, flip, float_out_, mul_, add_, out);
    });
    return Status::Ok();
  };
  // The buffer `cur` is not in (it is in buf[which] or the decoded image).
  auto next_buf = [&]() -> std::vector<uint8_t>& {
    which ^= 1;
    return buf[which];
  };
  auto materialize_flip = [&] {
    if (!flipped) return;
    std::vector<uint8_t>& dst = next_buf();
    const size_t row = static_cast<size_t>(3) * cur.width;
    if (dst.size() < row * cur.height) dst.resize(row * cur.height);
    for (int y = 0; y < cur.height; ++y) {
      const uint8_t* s = cur.data + y * cur.stride;
      uint8_t* d = dst.data() + y * row;
      for (int x = 0; x < cur.width; ++x) std::memcpy(d + 3 * (cur.width - 1 - x), s + 3 * x, 3);
    }
    cur = Packed(dst, cur.width, cur.height);
    flipped = false;
  };
  for (size_t op_i = 0; op_i < ops_.size(); ++op_i) {
    const TransformOp& op = ops_[op_i];
    switch (op.kind) {
      case OpKind::kHorizontalFlip:
        if (flip_i >= plan.flips.size()) return InternalError("transform plan has too few flips");
        if (plan.flips[flip_i++]) flipped = !flipped;
        break;
      case OpKind::kResize: {
        // Bilinear/area resizing is mirror-symmetric, so a pending flip can wait.
        int nh = op.height, nw = op.width;
        if (nh == 0) {
          const auto s = ResizeShorterSide(w, h, op.width);
          nh = s[0];
          nw = s[1];
        }
        // Plan gives no region to a resize-first pipeline.
        if (partial && first_geom) return InternalError("resize of a partially decoded image");
        first_geom = false;
        if (op_i == last_geom) return fuse(cur, nh, nw, op.antialias);
        std::vector<uint8_t>& dst = next_buf();
        ResizeTo(cur, dst, nh, nw, op.antialias);
        cur = Packed(dst, nw, nh);
        w = nw;
        h = nh;
        sx = sy = 1.0;
        ox = oy = 0;
        break;
      }
      case OpKind::kCenterCrop: {
        materialize_flip();
        if (sx != 1.0 || sy != 1.0) return InternalError("scaled decode before CenterCrop");
        const int th = op.height, tw = op.width;
        if (tw > w || th > h) {
          // torchvision pads with zeros (left/top get the smaller half), then crops.
          const int pl = tw > w ? (tw - w) / 2 : 0, pt = th > h ? (th - h) / 2 : 0;
          const int pr = tw > w ? (tw - w + 1) / 2 : 0, pb = th > h ? (th - h + 1) / 2 : 0;
          std::vector<uint8_t>& dst = next_buf();
          const int pw = cur.width + pl + pr, ph = cur.height + pt + pb;
          dst.assign(static_cast<size_t>(3) * pw * ph, 0);
          for (int y = 0; y < cur.height; ++y) {
            std::memcpy(dst.data() + (static_cast<size_t>(y + pt) * pw + pl) * 3, cur.data + y * cur.stride,
                        static_cast<size_t>(3) * cur.width);
          }
          cur = Packed(dst, pw, ph);
          w += pl + pr;
          h += pt + pb;
        }
        const int top = RoundHalfEven((h - th) / 2.0) - oy, left = RoundHalfEven((w - tw) / 2.0) - ox;
        if (top < 0 || left < 0 || left + tw > cur.width || top + th > cur.height) {
          return InternalError("center crop outside the decoded region");
        }
        cur = {cur.data + top * cur.stride + 3 * static_cast<size_t>(left), tw, th, cur.stride};
        first_geom = false;
        w = tw;
        h = th;
        ox = oy = 0;
        break;
      }
      case OpKind::kRandomResizedCrop: {
        materialize_flip();
        if (box_i >= plan.boxes.size()) return InternalError("transform plan has too few boxes");
        const Box& b = plan.boxes[box_i++];
        // Box in the (possibly DCT-scaled) image: cover the same area, at least 1 pixel.
        int x0 = static_cast<int>(std::floor(b.left * sx)) - ox;
        int y0 = static_cast<int>(std::floor(b.top * sy)) - oy;
        int x1 = static_cast<int>(std::ceil((b.left + b.width) * sx)) - ox;
        int y1 = static_cast<int>(std::ceil((b.top + b.height) * sy)) - oy;
        x0 = std::clamp(x0, 0, cur.width - 1);
        y0 = std::clamp(y0, 0, cur.height - 1);
        x1 = std::clamp(x1, x0 + 1, cur.width);
        y1 = std::clamp(y1, y0 + 1, cur.height);
        const Rgb8View roi{cur.data + y0 * cur.stride + 3 * static_cast<size_t>(x0), x1 - x0, y1 - y0, cur.stride};
        if (op_i == last_geom) return fuse(roi, op.height, op.width, op.antialias);
        std::vector<uint8_t>& dst = next_buf();
        ResizeTo(roi, dst, op.height, op.width, op.antialias);
        cur = Packed(dst, op.width, op.height);
        first_geom = false;
        w = op.width;
        h = op.height;
        sx = sy = 1.0;
        ox = oy = 0;
        break;
      }
      case OpKind::kToTensor:
      case OpKind::kPILToTensor:
      case OpKind::kNormalize:
        break;
    }
  }
  if (cur.height != out_h || cur.width != out_w) {
    return InternalError("transform produced " + std::to_string(cur.height) + "x" +
                         std::to_string(cur.width) + ", declared " + std::to_string(out_h) + "x" +
                         std::to_string(out_w));
  }
  for (int y = 0; y < out_h; ++y) {
    WriteRow(cur.data + y * cur.stride, y, out_h, out_w, flipped, float_out_, mul_, add_, out);
  }
  return Status::Ok();
}

}  // namespace ddp::image
