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
#include "ops/swiglu_train/swiglu_train.h"
#include "ops/weighted_mse/weighted_mse.h"
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

// The descale fused into the passes that read the GEMM outputs (swiglu_train forward for a|b, weighted_mse
// for Ŷ): the same bits as descale_rows then the plain pass, padding rows included.
TEST(DescaleRows, FusedIntoSwigluAndLossIsTheSeparatePass) {
  const int64_t rows = 9, I = 64, H = 96;
  std::mt19937_64 g(8);
  std::normal_distribution<float> nd(0.0f, 3000.0f);
  std::uniform_real_distribution<float> ud(100.0f, 3000.0f);
  std::vector<float> ab(rows * 2 * I), y(rows * H), y_ref(rows * H), w(rows), rg(rows), gw{ud(g)};
  for (auto& v : ab) v = nd(g);
  for (auto& v : y) v = nd(g);
  for (auto& v : y_ref) v = 0.001f * nd(g);
  for (auto& v : w) v = 0.5f;
  for (auto& v : rg) v = ud(g);
  rg[4] = 0.0f, w[4] = 0.0f;  // a padding row
  // a|b: separate pass, then SwiGLU (+ Q_a).
  std::vector<float> ab_sep = ab, h_sep(rows * I), h_fused(rows * I), ab_fused(rows * 2 * I, -1.0f);
  moesq::ops::descale_rows_ref({.x = ab_sep.data(), .rows = rows, .C = 2 * I, .row_gamma = rg.data(), .gamma = gw.data()});
  moesq::ops::swiglu_train_forward_ref({.rows = rows, .I = I, .ab = ab_sep.data(), .h = h_sep.data(), .quantize = true,
                                        .block = 32});
  moesq::ops::swiglu_train_forward_ref({.rows = rows, .I = I, .ab = ab.data(), .h = h_fused.data(), .quantize = true,
                                        .block = 32, .ab_row_gamma = rg.data(), .ab_gamma = gw.data(),
                                        .ab_out = ab_fused.data()});
  EXPECT_EQ(0, std::memcmp(ab_sep.data(), ab_fused.data(), ab.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(h_sep.data(), h_fused.data(), h_sep.size() * sizeof(float)));
  // Ŷ: separate pass, then the loss and its gradient.
  std::vector<float> y_sep = y, dy_sep(rows * H), dy_fused(rows * H);
  std::vector<double> l_sep(rows), l_fused(rows);
  moesq::ops::descale_rows_ref({.x = y_sep.data(), .rows = rows, .C = H, .row_gamma = rg.data(), .gamma = gw.data()});
  moesq::ops::weighted_mse_ref({.rows = rows, .H = H, .y = y_sep.data(), .y_ref = y_ref.data(), .w = w.data(),
                                .inv_norm = 1e-3, .dy = dy_sep.data(), .row_loss = l_sep.data()});
  moesq::ops::weighted_mse_ref({.rows = rows, .H = H, .y = y.data(), .y_ref = y_ref.data(), .w = w.data(),
                                .inv_norm = 1e-3, .dy = dy_fused.data(), .row_loss = l_fused.data(),
                                .y_row_gamma = rg.data(), .y_gamma = gw.data()});
  EXPECT_EQ(0, std::memcmp(dy_sep.data(), dy_fused.data(), dy_sep.size() * sizeof(float)));
  EXPECT_EQ(l_sep, l_fused);
  EXPECT_GT(l_sep[0], 0.0);
  EXPECT_ERROR_CONTAINING(moesq::ops::weighted_mse_ref({.rows = rows, .H = H, .y = y.data(), .y_ref = y_ref.data(),
                                                        .w = w.data(), .inv_norm = 1e-3, .dy = dy_fused.data(),
                                                        .y_gamma = gw.data()}),
                          "given together");
  EXPECT_ERROR_CONTAINING(moesq::ops::swiglu_train_forward_ref({.rows = rows, .I = I, .ab = ab.data(), .h = h_fused.data(),
                                                                .ab_gamma = gw.data()}),
                          "given together");
}
