// CPU tests of ops::rmsnorm_ref (the GPU kernel's twin, compared bitwise in tests/gpu/test_engine_ops.cu)
// against the plain definition y = w · x / sqrt(mean(x²) + eps), evaluated in fp64 in row order: the
// bf16 output within one bf16 rounding, hi + lo within the residue's rounding, rows independent of the
// batch, an exact integer-valued case, awkward widths around the kernel's 256 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/rmsnorm/rmsnorm.h"

namespace {

using moesq::bf16_to_f32;
using moesq::ops::RmsNormArgs;

// y is the fp32 value rounded once to bf16: half an ulp is 2^-9 relative; the fp32 steps before it
// (1/sqrt rounded, x·inv, w·(·)) add ~3·2^-24. 2^-8 leaves room for both.
constexpr double kBf16RelTol = 1.0 / 256;
// hi + lo: the fp32 value's residue is rounded to bf16 (2^-9 of a residue ≤ 2^-9·|y|, i.e. 2^-18·|y|)
// plus the fp32 steps (~3·2^-24 ≈ 1.8e-7).
constexpr double kHiLoRelTol = 1e-5;
// Whole tensor: the relative Frobenius error of bf16 rounding is about 2^-9 / √3; bound it by 2^-9.
constexpr double kFrobRelTol = 1.0 / 512;
// Absolute floor for elements next to zero (x and w are O(1); a denormal-sized y is rounding noise).
constexpr double kAbsTol = 1e-30;

struct Case {
  int64_t n, D;
  std::vector<float> x, w;  // [n, D], [D]
};

Case random_case(int64_t n, int64_t D, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::uniform_real_distribution<float> wd(0.5f, 1.5f);
  Case c{n, D, std::vector<float>(n * D), std::vector<float>(D)};
  for (auto& v : c.x) v = nd(g);
  for (auto& v : c.w) v = wd(g);
  return c;
}

// The plain definition, fp64 throughout.
std::vector<double> plain_rmsnorm(const Case& c, double eps) {
  std::vector<double> y(c.n * c.D);
  for (int64_t r = 0; r < c.n; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < c.D; ++i) ss += static_cast<double>(c.x[r * c.D + i]) * c.x[r * c.D + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(c.D) + eps);
    for (int64_t i = 0; i < c.D; ++i) y[r * c.D + i] = c.w[i] * (c.x[r * c.D + i] * inv);
  }
  return y;
}

void run_ref(const Case& c, double eps, std::vector<uint16_t>& y, std::vector<uint16_t>* y_lo) {
  y.assign(c.n * c.D, 0);
  if (y_lo) y_lo->assign(c.n * c.D, 0);
  RmsNormArgs a;
  a.x = c.x.data(), a.w = c.w.data(), a.y = y.data(), a.y_lo = y_lo ? y_lo->data() : nullptr;
  a.n = c.n, a.D = c.D, a.eps = eps;
  moesq::ops::rmsnorm_ref(a);
}

TEST(RmsNormRef, MatchesThePlainDefinition) {
  uint64_t seed = 100;
  for (int64_t D : {1, 7, 255, 256, 257, 1000, 2048}) {
    for (int64_t n : {1, 3, 17}) {
      const Case c = random_case(n, D, ++seed);
      const double eps = 1e-6;
      std::vector<uint16_t> y, lo;
      run_ref(c, eps, y, &lo);
      const std::vector<double> want = plain_rmsnorm(c, eps);
      double err2 = 0.0, ref2 = 0.0;
      bool nonzero = false;
      for (int64_t i = 0; i < n * D; ++i) {
        const double got = bf16_to_f32(y[i]), hilo = got + bf16_to_f32(lo[i]);
        ASSERT_LE(std::fabs(got - want[i]), kAbsTol + kBf16RelTol * std::fabs(want[i]))
            << "n=" << n << " D=" << D << " first bad row " << i / D << " col " << i % D;
        ASSERT_LE(std::fabs(hilo - want[i]), kAbsTol + kHiLoRelTol * std::fabs(want[i]))
            << "hi+lo: n=" << n << " D=" << D << " first bad row " << i / D << " col " << i % D;
        err2 += (got - want[i]) * (got - want[i]);
        ref2 += want[i] * want[i];
        nonzero |= y[i] != 0;
      }
      EXPECT_TRUE(nonzero) << "n=" << n << " D=" << D;
      EXPECT_LE(std::sqrt(err2 / ref2), kFrobRelTol) << "n=" << n << " D=" << D;
    }
  }
}

// Constant rows of ±2 with eps = 0: mean(x²) = 4, 1/sqrt = 0.5 exactly, so y = ±w for integer w.
TEST(RmsNormRef, IntegerValuedCaseIsExact) {
  const int64_t n = 3, D = 300;
  Case c{n, D, std::vector<float>(n * D), std::vector<float>(D)};
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < D; ++i) c.x[r * D + i] = (r % 2 ? -2.0f : 2.0f);
  for (int64_t i = 0; i < D; ++i) c.w[i] = static_cast<float>(1 + i % 7);
  std::vector<uint16_t> y, lo;
  run_ref(c, 0.0, y, &lo);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < D; ++i) {
      ASSERT_EQ(bf16_to_f32(y[r * D + i]), (r % 2 ? -1.0f : 1.0f) * c.w[i]) << "row " << r << " col " << i;
      ASSERT_EQ(lo[r * D + i], 0) << "an exact value has no residue: row " << r << " col " << i;
    }
}

// A row's bits never depend on the other rows of the batch; y_lo is optional and does not change y.
TEST(RmsNormRef, RowsAreBatchInvariant) {
  const Case c = random_case(9, 777, 7);
  std::vector<uint16_t> all, all_lo;
  run_ref(c, 1e-6, all, &all_lo);
  for (int64_t r = 0; r < c.n; ++r) {
    const Case one{1, c.D, std::vector<float>(c.x.begin() + r * c.D, c.x.begin() + (r + 1) * c.D), c.w};
    std::vector<uint16_t> y;
    run_ref(one, 1e-6, y, nullptr);
    for (int64_t i = 0; i < c.D; ++i) ASSERT_EQ(y[i], all[r * c.D + i]) << "row " << r << " col " << i;
  }
}

TEST(RmsNormRef, RefusesBadSizesAndAcceptsNoRows) {
  const Case c = random_case(1, 8, 3);
  std::vector<uint16_t> y(8, 0x1234);
  RmsNormArgs a;
  a.x = c.x.data(), a.w = c.w.data(), a.y = y.data(), a.n = 1, a.D = 0;
  EXPECT_THROW(moesq::ops::rmsnorm_ref(a), moesq::Error);
  a.D = 8, a.n = 0;
  moesq::ops::rmsnorm_ref(a);
  for (uint16_t v : y) EXPECT_EQ(v, 0x1234) << "n = 0 writes nothing";
}

}  // namespace
