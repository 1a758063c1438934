// Small helpers of the tests that compare fp32 vectors: fresh normal draws from a seed, and bitwise
// equality (memcmp, so −0 ≠ +0 and NaN payloads count; empty vectors compare without touching data()).
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace moesq::test {

// n values ~ N(0, scale²) from mt19937_64(seed).
inline std::vector<float> rand_f32(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace moesq::test
