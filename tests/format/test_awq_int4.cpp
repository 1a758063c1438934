// AWQ int4 format: AutoAWQ nibble order, pack/unpack round trips, quantizer error bound, and an exactly
// representable (integer-valued) case. Checkpoint tensors: tests/audit/test_awq_tensors.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/half.h"
#include "core/splitmix64.h"
#include "format/awq_int4.h"

using namespace moesq;
using namespace moesq::format;

TEST(Awq, NibbleOrderIsAutoAwqs) {
  // AWQ_ORDER = [0,2,4,6,1,3,5,7]: column 1 lives in nibble 4 (bits 16..19), column 2 in nibble 1.
  std::vector<uint8_t> codes(8, 0);
  codes[1] = 0xf;
  EXPECT_EQ(static_cast<uint32_t>(awq_pack(codes, 1, 8)[0]), 0x000f0000u);
  codes.assign(8, 0);
  codes[2] = 0x3;
  EXPECT_EQ(static_cast<uint32_t>(awq_pack(codes, 1, 8)[0]), 0x00000030u);
  codes = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(static_cast<uint32_t>(awq_pack(codes, 1, 8)[0]), 0x75316420u);
}

TEST(Awq, PackUnpackRoundTripAndAccessor) {
  SplitMix64 g(11);
  const int64_t R = 5, N = 24;
  std::vector<uint8_t> codes(R * N);
  for (auto& c : codes) c = g.below(16);
  const auto words = awq_pack(codes, R, N);
  EXPECT_EQ(awq_unpack(words, R, N), codes);
  AwqLinear l;
  l.N = N;
  l.K = R;
  l.qweight = words;
  for (int64_t k = 0; k < R; ++k)
    for (int64_t n = 0; n < N; ++n) ASSERT_EQ(l.q(k, n), codes[k * N + n]) << "k=" << k << " n=" << n;
}

TEST(Awq, QuantizeErrorWithinHalfStep) {
  // Format error budget: a weight inside its group's [min, max] is off by at most s/2 plus the fp16
  // rounding of (q − z)·s (≤ 2^-11 relative to |ŵ|) — kSlack covers the fp16 rounding of s itself.
  constexpr float kSlack = 1e-3f;
  const int64_t N = 16, K = 256;
  SplitMix64 g(3);
  std::vector<float> W(N * K);
  for (auto& w : W) w = 0.3f * (2.0f * g.uniform() - 1.0f) + 0.05f;
  const AwqLinear l = awq_quantize(W, N, K);
  const auto D = awq_dequantize_ref(l);
  int nonzero = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const float s = f16_to_f32(l.scale(k / kAwqGroup, n));
      const float err = std::fabs(D[n * K + k] - W[n * K + k]);
      ASSERT_LE(err, 0.5f * s * (1.0f + kSlack) + std::fabs(D[n * K + k]) * 0x1p-11f)
          << "n=" << n << " k=" << k << " group=" << k / kAwqGroup;
      nonzero += D[n * K + k] != 0.0f;
    }
  EXPECT_GT(nonzero, N * K / 2);
}

TEST(Awq, ExactlyRepresentableWeightsRoundTrip) {
  // Weights (q − z)·s with s = 2^-4 and every group spanning the full code range: quantize recovers
  // the codes and dequant reproduces W exactly.
  const int64_t N = 8, K = 128;
  SplitMix64 g(5);
  std::vector<float> W(N * K);
  for (int64_t n = 0; n < N; ++n) {
    const int z = 3 + static_cast<int>(n % 5);
    for (int64_t k = 0; k < K; ++k) W[n * K + k] = static_cast<float>(static_cast<int>(g.below(16)) - z) * 0.0625f;
    W[n * K + 0] = -z * 0.0625f;         // code 0
    W[n * K + 1] = (15 - z) * 0.0625f;   // code 15
  }
  const auto l = awq_quantize(W, N, K);
  EXPECT_EQ(awq_dequantize_ref(l), W);
  EXPECT_THROW(awq_quantize(std::vector<float>(8 * 100, 1.0f), 8, 100), moesq::Error);  // K % 128
}
