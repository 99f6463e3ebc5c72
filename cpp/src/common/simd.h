// The x86 SIMD level the engine's hand-written loops run at, chosen at run time. The
// wheel's baseline is SSE2 (every x86-64 CPU); higher levels are used only when the CPU
// has them, and every level gives the same values as the SSE2 loops (the tests compare
// them by capping the level). Other architectures report the baseline.
#pragma once

namespace ddp {

// Ordered: a level includes the ones below it.
enum class Simd { kSse2 = 0, kSsse3 = 1, kAvx2 = 2 };

// The level to run: the best this CPU has (checked once), unless a test capped it.
Simd SimdLevel();

// Tests only: run at most the loops of `cap` (kAvx2 lifts the cap), to compare every level.
void CapSimdForTesting(Simd cap);

// "sse2", "ssse3" or "avx2", for messages.
const char* SimdName(Simd level);

}  // namespace ddp
