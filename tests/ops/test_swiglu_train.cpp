// CPU tests of ops::swiglu_train_forward_ref / swiglu_train_backward_ref (the GPU kernels' twins,
// tests/gpu/test_refine_ops.cu) against the plain definitions
//   forward   h = a · σ(a) · b, σ(a) = 1 / (1 + e^−a)  (core/swiglu.h's fp32 order: bitwise), then Q_a per row
//             (format::quantize_activation_row: bitwise);
//   backward  da = dh · b · σ(a)(1 + a(1 − σ(a))), db = dh · a · σ(a): within fp32 rounding of the fp64
//             derivative, which itself matches a central finite difference of the fp64 forward;
// plus the nonfinite flag (a NaN input), an empty batch and the argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "format/nvfp4.h"
#include "ops/swiglu_train/swiglu_train.h"
#include "support/expect_error.h"

namespace {

using moesq::ops::SwigluTrainArgs;

// fp32 backward vs the fp64 derivative: ~6 roundings of 2^-24 each, and 1 − σ loses relative accuracy
// where σ → 1 (|a| ≤ 8 here: 1 − σ ≥ 3e-4, ~2^-12 relative of its ulp on a term ≤ a(1−σ)), so per element
// atol + rtol·|ref| with rtol 2^-18 and atol 2^-20·|dh|·(|b| + 1).
constexpr double kBwdRelTol = 0x1p-18;
constexpr double kBwdAbsTolUnit = 0x1p-20;
// Central differences of the fp64 forward with step 1e-5: truncation O(step²) ≈ 1e-10 × |f'''|.
constexpr double kFiniteDiffTol = 1e-7;

std::vector<float> random_ab(int64_t rows, int64_t I, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 2.5f);
  std::vector<float> ab(rows * 2 * I);
  for (auto& v : ab) v = std::clamp(nd(g), -8.0f, 8.0f);
  return ab;
}

float plain_h(float a, float b) {
  const float s = 1.0f / (1.0f + std::exp(-a));
  return a * s * b;
}
double h64(double a, double b) { return a / (1.0 + std::exp(-a)) * b; }

int64_t first_diff(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace

TEST(SwigluTrain, ForwardMatchesPlainDefinitionBitwise) {
  for (const int block : {16, 32})
    for (const int64_t I : {32, 96, 768})
      for (const int64_t rows : {1, 3, 17}) {
        const auto ab = random_ab(rows, I, 100 * I + rows + block);
        for (const bool quantize : {false, true}) {
          std::vector<float> h(rows * I, -1.0f);
          int32_t flag = 0;
          moesq::ops::swiglu_train_forward_ref({.rows = rows, .I = I, .ab = ab.data(), .h = h.data(),
                                                .quantize = quantize, .block = block, .nonfinite = &flag});
          std::vector<float> want(rows * I);
          for (int64_t i = 0; i < rows; ++i)
            for (int64_t c = 0; c < I; ++c) want[i * I + c] = plain_h(ab[i * 2 * I + c], ab[i * 2 * I + I + c]);
          if (quantize)
            for (int64_t i = 0; i < rows; ++i) moesq::format::quantize_activation_row(want.data() + i * I, I, block);
          EXPECT_EQ(first_diff(h, want), -1) << "quantize=" << quantize << " block=" << block << " rows=" << rows
                                             << " I=" << I;
          EXPECT_EQ(flag, 0);
          int64_t nonzero = 0;
          for (float v : h) nonzero += v != 0.0f;
          EXPECT_GT(nonzero, rows * I / 4);  // NVFP4 rounds the small silu tail to 0, not most values
        }
      }
}

TEST(SwigluTrain, BackwardIsTheDerivativeOfTheForward) {
  for (const int64_t I : {32, 160})
    for (const int64_t rows : {1, 5}) {
      const auto ab = random_ab(rows, I, 7 * I + rows);
      std::mt19937_64 g(rows);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> dh(rows * I), dab(rows * 2 * I, -1.0f);
      for (auto& v : dh) v = nd(g);
      moesq::ops::swiglu_train_backward_ref({.rows = rows, .I = I, .ab = ab.data(), .dh = dh.data(), .dab = dab.data()});
      double max_fd_err = 0.0;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < I; ++c) {
          const double a = ab[i * 2 * I + c], b = ab[i * 2 * I + I + c], d = dh[i * I + c];
          const double s = 1.0 / (1.0 + std::exp(-a));
          const double da = d * b * s * (1.0 + a * (1.0 - s)), db = d * a * s;
          const double atol = kBwdAbsTolUnit * std::fabs(d) * (std::fabs(b) + 1.0);
          ASSERT_NEAR(dab[i * 2 * I + c], da, atol + kBwdRelTol * std::fabs(da)) << "da row " << i << " col " << c;
          ASSERT_NEAR(dab[i * 2 * I + I + c], db, atol + kBwdRelTol * std::fabs(db)) << "db row " << i << " col " << c;
          // The fp64 formula is the derivative: central differences of h64.
          const double e = 1e-5;
          const double fd_a = d * (h64(a + e, b) - h64(a - e, b)) / (2 * e);
          const double fd_b = d * (h64(a, b + e) - h64(a, b - e)) / (2 * e);
          max_fd_err = std::max({max_fd_err, std::fabs(fd_a - da) / (1.0 + std::fabs(da)),
                                 std::fabs(fd_b - db) / (1.0 + std::fabs(db))});
        }
      EXPECT_LT(max_fd_err, kFiniteDiffTol) << "rows=" << rows << " I=" << I;
    }
}

TEST(SwigluTrain, NanSetsTheNonfiniteFlagAndEmptyBatchIsFine) {
  const int64_t rows = 3, I = 64;
  auto ab = random_ab(rows, I, 9);
  ab[1 * 2 * I + 5] = std::numeric_limits<float>::quiet_NaN();  // a of row 1, column 5
  std::vector<float> h(rows * I);
  int32_t flag = 0;
  moesq::ops::swiglu_train_forward_ref(
      {.rows = rows, .I = I, .ab = ab.data(), .h = h.data(), .quantize = true, .block = 32, .nonfinite = &flag});
  EXPECT_EQ(flag, 1);
  EXPECT_TRUE(std::isnan(h[1 * I + 5]));  // left unquantized (fake_quant_ref writes nothing)
  // An overflowing product (inf) is flagged too.
  auto big = random_ab(1, I, 10);
  big[3] = 8.0f, big[I + 3] = std::numeric_limits<float>::max();
  flag = 0;
  std::vector<float> hb(I);
  moesq::ops::swiglu_train_forward_ref(
      {.rows = 1, .I = I, .ab = big.data(), .h = hb.data(), .quantize = true, .block = 32, .nonfinite = &flag});
  EXPECT_EQ(flag, 1);
  float dummy = 0.0f;
  EXPECT_NO_THROW(moesq::ops::swiglu_train_forward_ref({.rows = 0, .I = I, .ab = &dummy, .h = &dummy}));
  EXPECT_NO_THROW(moesq::ops::swiglu_train_backward_ref({.rows = 0, .I = I, .ab = &dummy, .dh = &dummy, .dab = &dummy}));
}

TEST(SwigluTrain, ArgumentErrorsNameTheProblem) {
  const auto ab = random_ab(2, 32, 1);
  std::vector<float> h(64), dab(128);
  const SwigluTrainArgs a{.rows = 2, .I = 32, .ab = ab.data(), .h = h.data(), .dh = h.data(), .dab = dab.data()};
  SwigluTrainArgs b = a;
  b.I = 0;
  EXPECT_ERROR_CONTAINING(moesq::ops::swiglu_train_forward_ref(b), "bad shape rows=2 I=0");
  b = a;
  b.rows = -3;
  EXPECT_ERROR_CONTAINING(moesq::ops::swiglu_train_backward_ref(b), "bad shape rows=-3");
  b = a;
  b.ab = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::swiglu_train_forward_ref(b), "ab is null");
  b = a;
  b.h = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::swiglu_train_forward_ref(b), "h is null");
  b = a;
  b.dh = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::swiglu_train_backward_ref(b), "dh/dab is null");
  b = a;
  b.dab = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::swiglu_train_backward_ref(b), "dh/dab is null");
  // Q_a needs I % block == 0 (the header's precondition): the quantizer names it.
  std::vector<float> ab40(2 * 2 * 48), h40(2 * 48);
  EXPECT_ERROR_CONTAINING(moesq::ops::swiglu_train_forward_ref(
                              {.rows = 2, .I = 48, .ab = ab40.data(), .h = h40.data(), .quantize = true, .block = 32}),
                          "K=48 is not a multiple of block=32");
}
