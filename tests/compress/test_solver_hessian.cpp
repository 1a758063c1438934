// Tests of the Hessian accumulation and the fp64 Cholesky factors behind SGPTQ (compress/hessian.h).
// Each fast path is checked against its plain-loop twin or against the defining identity
// (L Lᵀ = A, Uᵀ U H = I) on fresh random inputs with fixed seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "compress/hessian.h"
#include "core/error.h"

namespace mc = moesq::compress;

namespace {

// fp64 accumulation of a few hundred rows: the dsyrk and loop orders differ by ~K·eps relative.
constexpr double kHessianRelTol = 1e-12;
// Identities of a well-conditioned (damped) K = 96 factorisation: cond ≲ 1e3, eps ≈ 1e-16.
constexpr double kFactorAbsTol = 1e-10;

std::vector<float> gaussian(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

double max_abs_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double amax = 0.0, dmax = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    amax = std::max(amax, std::fabs(b[i]));
    dmax = std::max(dmax, std::fabs(a[i] - b[i]));
  }
  return dmax / amax;
}

}  // namespace

TEST(Hessian, MatchesPlainLoopsWithAndWithoutRowWeights) {
  const int64_t n = 333, K = 64;  // n not a multiple of anything
  const auto X = gaussian(n * K, 11);
  std::vector<float> w(n);
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (float& x : w) x = u(rng);
  for (const float* rw : {static_cast<const float*>(nullptr), static_cast<const float*>(w.data())}) {
    const auto h = mc::accumulate_hessian(X.data(), n, K, rw);
    const auto r = mc::accumulate_hessian_ref(X.data(), n, K, rw);
    ASSERT_EQ(h.K, K);
    ASSERT_EQ(h.n, n);
    ASSERT_EQ(h.H.size(), static_cast<size_t>(K * K));
    EXPECT_LT(max_abs_rel_diff(h.H, r.H), kHessianRelTol) << "weighted=" << (rw != nullptr);
    for (int64_t i = 0; i < K; ++i) {
      EXPECT_GT(h.H[i * K + i], 0.0) << "diag " << i;
      for (int64_t j = 0; j < i; ++j) ASSERT_EQ(h.H[i * K + j], h.H[j * K + i]) << i << "," << j;
    }
  }
}

TEST(Hessian, AddRowsInChunksEqualsOneShot) {
  const int64_t K = 32;
  const auto X = gaussian(500 * K, 21);
  const auto whole = mc::accumulate_hessian(X.data(), 500, K);
  mc::Hessian h;  // empty: K taken from the first add
  mc::hessian_add_rows(h, X.data(), 123, K);
  mc::hessian_add_rows(h, X.data() + 123 * K, 0, K);
  mc::hessian_add_rows(h, X.data() + 123 * K, 377, K);
  EXPECT_EQ(h.n, 500);
  EXPECT_LT(max_abs_rel_diff(h.H, whole.H), kHessianRelTol);
  EXPECT_THROW(mc::hessian_add_rows(h, X.data(), 10, K + 8), moesq::Error);
}

TEST(Hessian, NoRowsGivesZeroMatrix) {
  const auto h = mc::accumulate_hessian(nullptr, 0, 64);
  EXPECT_EQ(h.n, 0);
  EXPECT_EQ(h.K, 64);
  ASSERT_EQ(h.H.size(), 64u * 64u);
  for (double v : h.H) ASSERT_EQ(v, 0.0);
}

TEST(Hessian, RejectsNegativeRowWeight) {
  const auto X = gaussian(4 * 8, 31);
  const std::vector<float> w = {1.0f, -0.5f, 1.0f, 1.0f};
  EXPECT_THROW(mc::accumulate_hessian(X.data(), 4, 8, w.data()), moesq::Error);
}

using CholFn = bool (*)(std::vector<double>&, int64_t, double);
using InvFn = bool (*)(const std::vector<double>&, int64_t, std::vector<double>&);
struct Paths {
  const char* name;
  CholFn chol;
  InvFn inv;
};
constexpr Paths kPaths[] = {{"lapack", mc::cholesky_lower, mc::inverse_cholesky_upper},
                            {"ref", mc::cholesky_lower_ref, mc::inverse_cholesky_upper_ref}};

TEST(Cholesky, LowerFactorReproducesMatrix) {
  const int64_t n = 400, K = 96;
  const auto X = gaussian(n * K, 41);
  auto h = mc::accumulate_hessian(X.data(), n, K);
  for (const auto& path : kPaths) {
    std::vector<double> L = h.H;
    ASSERT_TRUE(path.chol(L, K, 0.0)) << path.name;
    double err = 0.0;
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) {
        if (j > i) ASSERT_EQ(L[i * K + j], 0.0) << path.name << ": upper not zeroed at " << i << "," << j;
        double s = 0.0;
        for (int64_t k = 0; k < K; ++k) s += L[i * K + k] * L[j * K + k];
        err = std::max(err, std::fabs(s - h.H[i * K + j]));
      }
    EXPECT_LT(err, kFactorAbsTol) << path.name;
  }
}

TEST(Cholesky, InverseUpperFactorSatisfiesUtUHEqualsIdentity) {
  const int64_t n = 400, K = 96;
  const auto X = gaussian(n * K, 51);
  auto h = mc::accumulate_hessian(X.data(), n, K);
  std::vector<double> U_fast;
  for (const auto& path : kPaths) {
    std::vector<double> U;
    ASSERT_TRUE(path.inv(h.H, K, U)) << path.name;
    // P = Uᵀ U (= H⁻¹), then P·H must be I.
    std::vector<double> P(K * K, 0.0);
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) {
        if (j < i) ASSERT_EQ(U[i * K + j], 0.0) << path.name << ": not upper at " << i << "," << j;
        double s = 0.0;
        for (int64_t k = 0; k < K; ++k) s += U[k * K + i] * U[k * K + j];
        P[i * K + j] = s;
      }
    for (int64_t i = 0; i < K; ++i) EXPECT_GT(U[i * K + i], 0.0) << path.name << " diag " << i;
    double err = 0.0;
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) {
        double s = 0.0;
        for (int64_t k = 0; k < K; ++k) s += P[i * K + k] * h.H[k * K + j];
        err = std::max(err, std::fabs(s - (i == j ? 1.0 : 0.0)));
      }
    EXPECT_LT(err, kFactorAbsTol) << path.name;
    if (U_fast.empty()) {
      U_fast = U;
    } else {
      EXPECT_LT(max_abs_rel_diff(U_fast, U), kFactorAbsTol) << "LAPACK vs plain-loop factor";
    }
  }
}

TEST(Cholesky, FailsOnIndefiniteSingularAndNonFinite) {
  // Rank-deficient Hessian: fewer rows than K and no damping must be refused, not "factored"
  // with rounding-level pivots.
  const int64_t n = 16, K = 64;
  const auto X = gaussian(n * K, 61);
  const auto h = mc::accumulate_hessian(X.data(), n, K);
  for (const auto& path : kPaths) {
    std::vector<double> indefinite = {1.0, 2.0, 2.0, 1.0};
    EXPECT_FALSE(path.chol(indefinite, 2, 0.0)) << path.name;
    std::vector<double> with_nan = {1.0, 0.0, 0.0, std::nan("")};
    EXPECT_FALSE(path.chol(with_nan, 2, 0.0)) << path.name;
    std::vector<double> U;
    EXPECT_FALSE(path.inv(h.H, K, U)) << path.name;
    // ... while the same matrix with 1 % damping factors fine.
    auto damped = h.H;
    double mean = 0.0;
    for (int64_t k = 0; k < K; ++k) mean += h.H[k * K + k] / K;
    for (int64_t k = 0; k < K; ++k) damped[k * K + k] += 0.01 * mean;
    EXPECT_TRUE(path.inv(damped, K, U)) << path.name;
  }
}
