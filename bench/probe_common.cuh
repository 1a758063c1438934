// Shared by the operand-order probes (probe_mma_order.cu, probe_wgmma_order.cu): their flags, the random
// operands that stress the alignment of a k16 step's products (bf16 scaled by 2^[-12, 12], cancelling
// signs, token rows split hi + lo as the engine's activations), the mma.m16n8k16 A fragment load, and
// the fp32 bit comparison.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"

namespace moesq::probe {

struct ProbeArgs {
  int trials = 0, K = 2048;
};

// `--trials N` and `--k K` over the defaults; false (after a message naming the probe) on an unknown flag,
// trials < 1, or K not a positive multiple of 16.
inline bool parse_probe_args(int argc, char** argv, const char* name, ProbeArgs& p) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--trials") p.trials = std::atoi(argv[i + 1]);
    else if (a == "--k") p.K = std::atoi(argv[i + 1]);
    else return std::fprintf(stderr, "%s: unknown flag %s (--trials N, --k K)\n", name, a.c_str()), false;
  }
  if (p.trials < 1 || p.K < 16 || p.K % 16 != 0)
    return std::fprintf(stderr, "%s: --trials ≥ 1 and --k a multiple of 16 required\n", name), false;
  return true;
}

// Random operands of one trial: x / xl [·, K] (rows past `rows` stay as given: zero in the callers) the
// hi and lo bf16 parts of N(0,1)·2^[-12, 12] values; w every element N(0,1)·2^[-6, 6] in bf16.
struct ProbeRng {
  std::mt19937_64 rng;
  std::normal_distribution<float> nd{0.0f, 1.0f};
  std::uniform_int_distribution<int> ex{-12, 12};
  explicit ProbeRng(uint64_t seed) : rng(seed) {}
  void tokens(std::vector<uint16_t>& x, std::vector<uint16_t>& xl, int rows, int K) {
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < K; ++k) {
        const float v = std::ldexp(nd(rng), ex(rng));
        const uint16_t hi = f32_to_bf16(v);
        x[r * K + k] = hi;
        xl[r * K + k] = f32_to_bf16(v - bf16_to_f32(hi));
      }
  }
  void weights(std::vector<uint16_t>& w) {
    for (auto& v : w) v = f32_to_bf16(std::ldexp(nd(rng), ex(rng) / 2));
  }
};

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

__device__ __forceinline__ uint32_t pair(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// A fragment (PTX ISA, mma.m16n8k16 .bf16) of rows r0 .. r0 + 15 of a row-major [·, K] matrix at k0.
__device__ __forceinline__ void load_a(const uint16_t* m, int K, int r0, int k0, int lane, uint32_t (&a)[4]) {
  const int g = lane >> 2, t = lane & 3;
  a[0] = pair(m + (r0 + g) * K + k0 + 2 * t);
  a[1] = pair(m + (r0 + g + 8) * K + k0 + 2 * t);
  a[2] = pair(m + (r0 + g) * K + k0 + 8 + 2 * t);
  a[3] = pair(m + (r0 + g + 8) * K + k0 + 8 + 2 * t);
}

}  // namespace moesq::probe
