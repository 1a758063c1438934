// SplitMix64: the small deterministic 64-bit generator the seed-000 fixtures, the emulated native
// alignment order and the synthetic AWQ weights draw from (fast, seedable, the same on every platform).
#pragma once
#include <cstdint>

namespace moesq {

// A small deterministic 64-bit generator (splitmix64) shared by the fixtures: fast and seedable.
struct SplitMix64 {
  uint64_t s;
  explicit SplitMix64(uint64_t seed) : s(seed) {}
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }                          // n small: bias negligible
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
};

}  // namespace moesq
