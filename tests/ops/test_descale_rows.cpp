// CPU tests of ops::descale_rows_ref (the GPU kernel's twin, compared bitwise in tests/gpu/test_refine_ops.cu):
// the epilogue of the bf16 forward — a GEMM of unscaled NVFP4 operands divided by the two γ equals the GEMM
// of the fake-quantized values (in double: exactly up to the final roundings); padding rows; errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/descale_rows/descale_rows.h"
#include "ops/fake_quant/fake_quant.h"
#include "support/expect_error.h"

namespace {

using moesq::ops::descale_rows_ref;
using moesq::ops::fake_quant_ref;

float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// A fp32 result is within this many units of fp32 rounding of the exact value: the GEMM sum (exact in
// double here) is rounded once to fp32, then twice more by the two divisions.
constexpr double kDescaleRelTol = 4 * 6e-8;

}  // namespace

TEST(DescaleRows, Bf16GemmOfUnscaledOperandsIsTheFakeQuantGemm) {
  const int64_t M = 7, N = 5, K = 96;
  std::mt19937_64 g(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> A(M * K), B(N * K);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < K; ++k) A[r * K + k] = std::ldexp(nd(g), static_cast<int>(r) - 3);
  for (auto& v : B) v = 0.02f * nd(g);
  std::vector<uint16_t> uA(A.size()), uB(B.size());
  std::vector<float> gA(M), gB(1);
  fake_quant_ref({.x = A.data(), .rows = M, .K = K, .block = 32, .per_row = true, .amax = nullptr, .nonfinite = nullptr,
                  .unscaled_bf16 = uA.data(), .gamma = gA.data()});
  fake_quant_ref({.x = B.data(), .rows = N, .K = K, .block = 32, .per_row = false, .amax = nullptr,
                  .nonfinite = nullptr, .unscaled_bf16 = uB.data(), .gamma = gB.data()});
  // What the tensor cores compute: Σ of exact products of the unscaled operands (here in double), fp32 out.
  std::vector<float> C(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += double(bf16_to_float(uA[i * K + k])) * bf16_to_float(uB[j * K + k]);
      C[i * N + j] = static_cast<float>(acc);
    }
  descale_rows_ref({.x = C.data(), .rows = M, .C = N, .row_gamma = gA.data(), .gamma = gB.data()});
  int64_t nonzero = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double want = 0.0, mag = 0.0;  // the GEMM of the fake-quantized fp32 values, exactly; Σ|products|
      for (int64_t k = 0; k < K; ++k) {
        want += double(A[i * K + k]) * B[j * K + k];
        mag += std::fabs(double(A[i * K + k]) * B[j * K + k]);
      }
      // The fp32 values A, B are themselves the unscaled ones over γ rounded once each (2 units of each
      // product, so of Σ|products|), the descaled sum 3 roundings of |want|.
      EXPECT_NEAR(C[i * N + j], want, kDescaleRelTol * std::fabs(want) + 4 * 6e-8 * mag) << i << "," << j;
      nonzero += C[i * N + j] != 0.0f;
    }
  EXPECT_GT(nonzero, M * N / 2);
}

TEST(DescaleRows, TwoDivisionsAndAZeroPaddingRow) {
  std::vector<float> x{6.0f, -3.0f, 1.0f, 1.0f, 7.0f, 8.0f}, rg{3.0f, 0.0f, 0.5f}, g{2.0f};
  descale_rows_ref({.x = x.data(), .rows = 3, .C = 2, .row_gamma = rg.data(), .gamma = g.data()});
  EXPECT_EQ(x, (std::vector<float>{1.0f, -0.5f, 0.0f, 0.0f, 7.0f, 8.0f}));
  float v = 1.0f;
  EXPECT_ERROR_CONTAINING(descale_rows_ref({.x = &v, .rows = 1, .C = 0, .row_gamma = &v, .gamma = &v}), "bad shape");
  EXPECT_ERROR_CONTAINING(descale_rows_ref({.x = &v, .rows = 1, .C = 1, .row_gamma = nullptr, .gamma = &v}),
                          "null pointer");
}
