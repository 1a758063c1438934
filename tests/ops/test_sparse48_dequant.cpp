// The sparse48_dequant op's CPU twin (the specification the kernel is compared with on the GPU,
// tests/gpu/test_refine_ops.cu): a packed tensor unpacks to what format::sparse48_dequantize gives,
// the descriptor's errors name the field, and a metadata nibble outside the 6 patterns is named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/nvfp4.h"
#include "ops/sparse48_dequant/sparse48_dequant.h"

namespace {

using namespace moesq;

format::Sparse48Tensor random_tensor(int64_t N, int64_t K, uint32_t seed, std::vector<float>* W) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  W->resize(static_cast<size_t>(N * K));
  for (auto& w : *W) w = nd(g);
  std::vector<uint8_t> pat(static_cast<size_t>(N * K / 8));
  for (auto& p : pat) p = static_cast<uint8_t>(g() % format::kNumPatterns);
  return format::sparse48_quantize(W->data(), N, K, pat.data(), 0.0f, "test");
}

TEST(Sparse48Dequant, TwinUnpacksTheQuantizedValuesAtTheKeptPositions) {
  std::vector<float> W;
  const int64_t N = 5, K = 96;
  const format::Sparse48Tensor t = random_tensor(N, K, 3, &W);
  std::vector<float> out(static_cast<size_t>(N * K), -1.0f);
  ops::sparse48_dequant_ref({.N = N, .K = K, .values = t.values.data(), .meta = t.meta.data(),
                             .scales = t.scales.data(), .global_scale = t.global_scale, .out = out.data()});
  const std::vector<uint8_t> pat = format::sparse48_patterns(t);
  int64_t kept = 0;
  for (int64_t i = 0; i < N * K; ++i) {
    const bool keep = (format::pattern_mask8(pat[i / 8]) >> (i % 8)) & 1;
    if (!keep) {
      EXPECT_EQ(out[i], 0.0f) << i;
      continue;
    }
    ++kept;
    // The NVFP4 rounding error of a kept value: at most half a step of its block's grid (≤ 1/3 of
    // the block's amax over 6 at the largest code) — a coarse bound, a wrong position is far off.
    EXPECT_NEAR(out[i], W[i], 0.02f) << i;
  }
  EXPECT_EQ(kept, N * K / 2);
}

TEST(Sparse48Dequant, ErrorsNameTheField) {
  std::vector<float> W;
  format::Sparse48Tensor t = random_tensor(2, 32, 5, &W);
  std::vector<float> out(64);
  ops::Sparse48DequantArgs a{.N = 2, .K = 32, .values = t.values.data(), .meta = t.meta.data(),
                             .scales = t.scales.data(), .global_scale = t.global_scale, .out = out.data()};
  auto message = [](const ops::Sparse48DequantArgs& x) -> std::string {
    try {
      ops::sparse48_dequant_ref(x);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  ops::Sparse48DequantArgs bad = a;
  bad.K = 48;
  EXPECT_NE(message(bad).find("K=48"), std::string::npos) << message(bad);
  bad = a;
  bad.global_scale = 0.0f;
  EXPECT_NE(message(bad).find("tensor scale"), std::string::npos) << message(bad);
  bad = a;
  bad.meta = nullptr;
  EXPECT_NE(message(bad).find("required"), std::string::npos) << message(bad);
  t.meta[1] = 0x0f;  // groups 2 and 3 of row 0: nibble 0xf is no pattern
  EXPECT_NE(message(a).find("nibble 0xf"), std::string::npos) << message(a);
}

}  // namespace
