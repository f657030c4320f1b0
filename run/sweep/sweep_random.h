// The samplers' random numbers: SplitMix64, with uniform and normal draws written out here so
// that a seed gives the same trials on every platform and standard library (std::
// distributions are implementation-defined). A generator per suggestion, seeded from (sweep
// seed, trial number, purpose), so a trial's draw does not depend on how many draws came before
// it: a resumed sweep suggests what the uninterrupted one would have. Not thread-safe (one
// generator, one thread).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace shoal::run::sweep {

class SweepRandom {
 public:
  SweepRandom(uint64_t seed, uint64_t trial, uint64_t purpose)
      : state_(mix(mix(seed ^ 0x5851f42d4c957f2dULL) ^ trial * 0x9e3779b97f4a7c15ULL) ^ purpose) {}

  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix(state_);
  }
  // In [0, 1), 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  // In [0, n), n >= 1 (the modulo bias is below 2^-40 for any n a sweep uses).
  uint64_t below(uint64_t n) { return next() % n; }
  // Standard normal (Box-Muller).
  double normal() {
    const double u = 1.0 - uniform();  // (0, 1]: log is finite
    return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * std::numbers::pi * uniform());
  }

 private:
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

}  // namespace shoal::run::sweep
