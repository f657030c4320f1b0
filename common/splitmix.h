// SplitMix64's finaliser (Steele, Lea and Flood; the seeding step of Java's SplittableRandom): a
// bijection on 64 bits that mixes every input bit into every output bit, so nearby inputs
// (consecutive steps, ranks, rows) give unrelated outputs. For seeds and positions, not for
// cryptography. Pure; thread-safe.
#pragma once

#include <cstdint>

namespace shoal {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace shoal
