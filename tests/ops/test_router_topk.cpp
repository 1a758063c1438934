// CPU tests of ops::router_topk_ref (the GPU kernel's twin, compared bitwise in
// tests/gpu/test_engine_ops.cu) against the plain definition: p = softmax(z) in fp64, the k largest p in
// descending order (equal p → lower expert id), weights p_j / Σ_j p_j (norm_topk_prob) or p_j.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "ops/router_topk/router_topk.h"

namespace {

using moesq::ops::RouterTopkArgs;

// Weights: fp32 exp, ≤ 16 strided adds per lane (E ≤ 512) and 5 butterfly levels, one division by the
// sum and one by the top-k sum: ~25 roundings of 2^-24 ≈ 1.5e-6 relative; 1e-5 leaves a margin.
constexpr double kWeightRelTol = 1e-5;
// Logits are distinct multiples of this step, so neighbouring probabilities differ by a factor
// exp(step) ≈ 1.01, far beyond fp32 error: the top-k ids must match the definition exactly.
constexpr float kLogitStep = 0.01f;

struct Result {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Result run_ref(const std::vector<float>& z, int64_t T, int E, int k, bool norm) {
  Result r{std::vector<int32_t>(T * k, -1), std::vector<float>(T * k, 0.0f)};
  RouterTopkArgs a;
  a.logits = z.data(), a.topk_ids = r.ids.data(), a.topk_w = r.w.data(), a.T = T, a.num_experts = E, a.topk = k;
  a.norm_topk_prob = norm;
  moesq::ops::router_topk_ref(a);
  return r;
}

// T rows of E distinct logits: a random permutation of {0, 1, …, E−1}·step, shifted per row.
std::vector<float> distinct_logits(int64_t T, int E, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> shift(-3.0f, 3.0f);
  std::vector<float> z(T * E);
  std::vector<int> perm(E);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    const float s = shift(g);
    for (int e = 0; e < E; ++e) z[t * E + e] = s + kLogitStep * static_cast<float>(perm[e]) * (E > 64 ? 1.0f : 10.0f);
  }
  return z;
}

TEST(RouterTopkRef, MatchesThePlainDefinition) {
  uint64_t seed = 500;
  for (int E : {1, 8, 33, 128, 512}) {
    for (int k : {1, 2, 8, 32}) {
      if (k > E) continue;
      for (bool norm : {true, false}) {
        const int64_t T = 17;
        const auto z = distinct_logits(T, E, ++seed);
        const Result r = run_ref(z, T, E, k, norm);
        bool nonzero = false;
        for (int64_t t = 0; t < T; ++t) {
          std::vector<double> p(E);
          double mx = z[t * E], sum = 0.0;
          for (int e = 0; e < E; ++e) mx = std::max(mx, static_cast<double>(z[t * E + e]));
          for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(z[t * E + e] - mx));
          for (auto& v : p) v /= sum;
          std::vector<int> order(E);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
          double top = 0.0;
          for (int j = 0; j < k; ++j) top += p[order[j]];
          for (int j = 0; j < k; ++j) {
            ASSERT_EQ(r.ids[t * k + j], order[j]) << "E=" << E << " k=" << k << " token " << t << " rank " << j;
            const double want = norm ? p[order[j]] / top : p[order[j]];
            ASSERT_LE(std::fabs(r.w[t * k + j] - want), kWeightRelTol * want)
                << "E=" << E << " k=" << k << " norm=" << norm << " token " << t << " rank " << j;
            nonzero |= r.w[t * k + j] != 0.0f;
          }
        }
        EXPECT_TRUE(nonzero);
      }
    }
  }
}

// Equal logits: every p is 1/E exactly (E a power of two, exp(0) = 1), ties go to the lower id, and the
// normalized weights are 1/k rounded once.
TEST(RouterTopkRef, TiesGoToTheLowerIdExactly) {
  const int E = 64, k = 6;
  const std::vector<float> z(3 * E, 0.75f);
  const Result r = run_ref(z, 3, E, k, true);
  const Result raw = run_ref(z, 3, E, k, false);
  for (int t = 0; t < 3; ++t)
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(r.ids[t * k + j], j) << "token " << t << " rank " << j;
      ASSERT_EQ(r.w[t * k + j], 1.0f / k) << "token " << t << " rank " << j;
      ASSERT_EQ(raw.w[t * k + j], 1.0f / E) << "token " << t << " rank " << j;
    }
}

TEST(RouterTopkRef, RowsAreBatchInvariantAndNoRowsIsFine) {
  const int E = 60, k = 4;
  const auto z = distinct_logits(5, E, 9);
  const Result all = run_ref(z, 5, E, k, true);
  for (int64_t t = 0; t < 5; ++t) {
    const Result one = run_ref(std::vector<float>(z.begin() + t * E, z.begin() + (t + 1) * E), 1, E, k, true);
    for (int j = 0; j < k; ++j) {
      ASSERT_EQ(one.ids[j], all.ids[t * k + j]) << "token " << t << " rank " << j;
      ASSERT_EQ(one.w[j], all.w[t * k + j]) << "token " << t << " rank " << j;
    }
  }
  run_ref(z, 0, E, k, true);
}

TEST(RouterTopkRef, ZeroesTheDispatchCountsWhenGiven) {
  const int E = 40, k = 3;
  const auto z = distinct_logits(2, E, 11);
  std::vector<int32_t> ids(2 * k), counts(E, 5);
  std::vector<float> w(2 * k);
  RouterTopkArgs a;
  a.logits = z.data(), a.topk_ids = ids.data(), a.topk_w = w.data(), a.T = 2, a.num_experts = E, a.topk = k;
  a.counts = counts.data();
  moesq::ops::router_topk_ref(a);
  EXPECT_EQ(counts, std::vector<int32_t>(E, 0));
  const Result plain = run_ref(z, 2, E, k, true);  // the routes do not depend on it
  EXPECT_EQ(ids, plain.ids);
  EXPECT_EQ(w, plain.w);
}

TEST(RouterTopkRef, RefusesBadSizes) {
  const std::vector<float> z(600, 0.0f);
  EXPECT_THROW(run_ref(z, 1, 513, 4, true), moesq::Error);  // E > 512
  EXPECT_THROW(run_ref(z, 1, 8, 0, true), moesq::Error);    // k < 1
  EXPECT_THROW(run_ref(z, 1, 8, 9, true), moesq::Error);    // k > E
  EXPECT_THROW(run_ref(z, 1, 64, 33, true), moesq::Error);  // k > 32
}

}  // namespace
