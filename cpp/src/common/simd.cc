#include "common/simd.h"

#include <algorithm>
#include <atomic>

namespace ddp {
namespace {

std::atomic<int> g_simd_cap{static_cast<int>(Simd::kAvx2)};

Simd CpuSimd() {
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("avx2")) return Simd::kAvx2;
  if (__builtin_cpu_supports("ssse3")) return Simd::kSsse3;
#endif
  return Simd::kSse2;
}

}  // namespace

void CapSimdForTesting(Simd cap) { g_simd_cap.store(static_cast<int>(cap)); }

Simd SimdLevel() {
  static const Simd cpu = CpuSimd();
  return static_cast<Simd>(std::min(static_cast<int>(cpu), g_simd_cap.load(std::memory_order_relaxed)));
}

const char* SimdName(Simd level) {
  switch (level) {
    case Simd::kSse2: return "sse2";
    case Simd::kSsse3: return "ssse3";
    case Simd::kAvx2: return "avx2";
  }
  return "unknown";
}

}  // namespace ddp
