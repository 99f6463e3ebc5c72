#include "common/simd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace ddp {
namespace {

// The level this CPU has, asked of the compiler's CPU check directly.
Simd Expected() {
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("avx2")) return Simd::kAvx2;
  if (__builtin_cpu_supports("ssse3")) return Simd::kSsse3;
#endif
  return Simd::kSse2;
}

TEST(Simd, ReportsTheBestLevelOfThisCpu) {
  CapSimdForTesting(Simd::kAvx2);
  EXPECT_EQ(SimdLevel(), Expected()) << "reported " << SimdName(SimdLevel()) << ", CPU has "
                                     << SimdName(Expected());
#if defined(__x86_64__)
  EXPECT_GE(SimdLevel(), Simd::kSse2);  // the x86-64 baseline
#endif
}

TEST(Simd, ACapLowersTheLevelButNeverRaisesIt) {
  const Simd cpu = Expected();
  for (Simd cap : {Simd::kSse2, Simd::kSsse3, Simd::kAvx2}) {
    CapSimdForTesting(cap);
    EXPECT_EQ(SimdLevel(), std::min(cap, cpu)) << "cap " << SimdName(cap);
  }
  CapSimdForTesting(Simd::kSse2);
  EXPECT_EQ(SimdLevel(), Simd::kSse2);
  CapSimdForTesting(Simd::kAvx2);  // lifted again: the other tests run at the CPU's level
  EXPECT_EQ(SimdLevel(), cpu);
}

TEST(Simd, LevelsAreOrderedAndNamed) {
  EXPECT_LT(Simd::kSse2, Simd::kSsse3);
  EXPECT_LT(Simd::kSsse3, Simd::kAvx2);
  EXPECT_EQ(std::string(SimdName(Simd::kSse2)), "sse2");
  EXPECT_EQ(std::string(SimdName(Simd::kSsse3)), "ssse3");
  EXPECT_EQ(std::string(SimdName(Simd::kAvx2)), "avx2");
}

}  // namespace
}  // namespace ddp
