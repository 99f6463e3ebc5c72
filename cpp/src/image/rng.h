// A small deterministic random generator for per-sample augmentation.
//
// Each sample's stream depends only on (seed, epoch, index), so a sample's crop and flip do
// not change with thread count, scheduling, sharding or resume. SplitMix64 passes BigCrush
// and is cheap to seed, which matters when one stream is made per sample.
#pragma once

#include <cstdint>

namespace ddp::image {

class Rng {
 public:
  explicit Rng(uint64_t state) : s_(state) {}
  // The stream for one sample of one epoch.
  static Rng ForSample(uint64_t seed, uint64_t epoch, uint64_t index) {
    Rng r(seed ^ 0x9E3779B97F4A7C15ull);
    r.s_ = r.Next() ^ (epoch * 0xD1B54A32D192ED03ull);
    r.s_ = r.Next() ^ (index * 0x8CB92BA72F3D8DD7ull);
    r.Next();
    return r;
  }

  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0: floor(Uniform() * n) (bias < 2^-20 for n < 2^32).
  uint64_t Below(uint64_t n) {
    const auto v = static_cast<uint64_t>(Uniform() * static_cast<double>(n));
    return v < n ? v : n - 1;
  }

 private:
  uint64_t s_;
};

}  // namespace ddp::image
