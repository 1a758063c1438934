// Varied ASCII text as byte tokens (the tiny fixture's vocabulary is bytes): words drawn from a
// fixed list by a seeded mt19937_64. The four engine parity windows (tests/gpu/test_engine.cu) and
// the rounding-floor measurement on the same windows (bench/e2e_rounding_floor.cpp) both use it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace moesq::test {

// n byte tokens [n] int32 in [0, 256), deterministic in `seed`.
inline std::vector<int32_t> text_tokens(size_t n, uint64_t seed) {
  static const char* words[] = {"the ", "expert ", "routes ", "a ", "token ", "to ", "sparse ", "cores, ", "and ",
                                "Hopper ", "runs ", "it. ", "Moe ", "layers ", "decode ", "fast\n"};
  std::mt19937_64 g(seed);
  std::vector<int32_t> t;
  while (t.size() < n)
    for (const char* c = words[g() % 16]; *c && t.size() < n; ++c) t.push_back(static_cast<unsigned char>(*c));
  return t;
}

}  // namespace moesq::test
