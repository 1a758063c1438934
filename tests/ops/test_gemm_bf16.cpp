// CPU tests of ops::gemm_bf16_ref (the twin of the tile and small-M GPU kernels, compared in
// tests/gpu/test_engine_ops.cu) against the plain definition y[g, m, n] = Σ_k x[g, m, k]·w[g, n, k]
// (+ x_lo's products), evaluated exactly enough in fp64 in REVERSED K order: the ref rounds the sum
// once to fp32. Also: accumulate, per-group counts (rows past the count untouched), ldy padding
// untouched, the bf16 output, an exact integer-valued case, M around the small-M bound and the tile.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/router_topk/router_topk.h"

namespace {

using moesq::bf16_to_f32;
using moesq::f32_to_bf16;
using moesq::ops::GemmBf16Args;

// The ref sums exact fp32 products in fp64 and rounds once to fp32: half an fp32 ulp (2^-24 of |y|),
// plus the fp64 summation error of either order, K·2^-53 of Σ|x·w| (≤ 1e-12 of it for K ≤ 4096).
constexpr double kF32RelTol = 1.0 / (1 << 24);
constexpr double kSumRelTol = 1e-12;
constexpr float kUntouched = -12345.0f;  // sentinel in every output the GEMM must not write

struct Problem {
  int groups = 1;
  int64_t M = 0, N = 0, K = 0, ldy = 0;
  std::vector<uint16_t> x, x_lo, w;  // [G, M, K], [G, M, K], [G, N, K] bf16
};

Problem make_problem(int groups, int64_t M, int64_t N, int64_t K, uint64_t seed, bool integer = false) {
  Problem p{groups, M, N, K, N + 3};
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> id(-3, 3);
  auto fill = [&](std::vector<uint16_t>& v, size_t n, float scale) {
    v.resize(n);
    for (auto& e : v) e = f32_to_bf16(integer ? static_cast<float>(id(g)) : scale * nd(g));
  };
  fill(p.x, static_cast<size_t>(groups) * M * K, 1.0f);
  fill(p.x_lo, static_cast<size_t>(groups) * M * K, 1.0f / 512);  // a bf16 residue's magnitude
  fill(p.w, static_cast<size_t>(groups) * N * K, 0.1f);
  return p;
}

// The plain definition at (g, m, n): the sum in reversed K order and Σ|products| for the tolerance.
void plain(const Problem& p, bool lo, int g, int64_t m, int64_t n, double* sum, double* abs_sum) {
  const uint16_t* xr = p.x.data() + (g * p.M + m) * p.K;
  const uint16_t* lr = p.x_lo.data() + (g * p.M + m) * p.K;
  const uint16_t* wr = p.w.data() + (g * p.N + n) * p.K;
  *sum = *abs_sum = 0.0;
  for (int64_t k = p.K - 1; k >= 0; --k) {
    const double xv = static_cast<double>(bf16_to_f32(xr[k])) + (lo ? bf16_to_f32(lr[k]) : 0.0f);
    const double t = xv * bf16_to_f32(wr[k]);
    *sum += t;
    *abs_sum += std::fabs(static_cast<double>(bf16_to_f32(xr[k])) * bf16_to_f32(wr[k])) +
                (lo ? std::fabs(static_cast<double>(bf16_to_f32(lr[k])) * bf16_to_f32(wr[k])) : 0.0);
  }
}

GemmBf16Args args_of(const Problem& p, bool lo, float* y_f32, uint16_t* y_bf16, const int32_t* counts) {
  GemmBf16Args a;
  a.x = p.x.data(), a.x_lo = lo ? p.x_lo.data() : nullptr, a.w = p.w.data(), a.y_f32 = y_f32, a.y_bf16 = y_bf16;
  a.counts = counts, a.groups = p.groups, a.M = p.M, a.N = p.N, a.K = p.K, a.ldy = p.ldy;
  return a;
}

TEST(GemmBf16Ref, MatchesThePlainDefinition) {
  uint64_t seed = 70;
  // M: 1, 2, 3 (decode), kGemmSmallM ± 1 (the small-M kernel's bound), a tile + 1.
  for (int64_t M : {1, 2, 3, 63, 65}) {
    for (int64_t K : {8, 64, 520}) {
      for (bool lo : {false, true}) {
        const Problem p = make_problem(2, M, 37, K, ++seed);
        std::vector<float> y(static_cast<size_t>(p.groups) * M * p.ldy, kUntouched);
        const std::vector<int32_t> counts = {static_cast<int32_t>(M), static_cast<int32_t>((M + 1) / 2)};
        moesq::ops::gemm_bf16_ref(args_of(p, lo, y.data(), nullptr, counts.data()));
        bool nonzero = false;
        for (int g = 0; g < p.groups; ++g)
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < p.ldy; ++n) {
              const float got = y[(g * M + m) * p.ldy + n];
              if (m >= counts[g] || n >= p.N) {
                ASSERT_EQ(got, kUntouched) << "M=" << M << " K=" << K << " group " << g << " row " << m << " col "
                                           << n << " (past the count or the row) was written";
                continue;
              }
              double want = 0.0, abs_sum = 0.0;
              plain(p, lo, g, m, n, &want, &abs_sum);
              ASSERT_LE(std::fabs(got - want), kF32RelTol * std::fabs(want) + kSumRelTol * abs_sum)
                  << "M=" << M << " N=" << p.N << " K=" << K << " lo=" << lo << " group " << g << " first bad (" << m
                  << ", " << n << ")";
              nonzero |= got != 0.0f;
            }
        EXPECT_TRUE(nonzero) << "M=" << M << " K=" << K;
      }
    }
  }
}

// Small integers: every product and partial sum is an integer of magnitude ≤ 9·K, exact in fp32 and
// fp64, so the fp32 output equals the sum bitwise and the bf16 output is that value rounded once.
TEST(GemmBf16Ref, IntegerValuedCaseIsExact) {
  const Problem p = make_problem(1, 5, 16, 64, 3, /*integer=*/true);
  std::vector<float> y(p.M * p.ldy, kUntouched);
  std::vector<uint16_t> yb(p.M * p.ldy, 0);
  moesq::ops::gemm_bf16_ref(args_of(p, false, y.data(), nullptr, nullptr));
  moesq::ops::gemm_bf16_ref(args_of(p, false, nullptr, yb.data(), nullptr));
  bool nonzero = false;
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      double want = 0.0, abs_sum = 0.0;
      plain(p, false, 0, m, n, &want, &abs_sum);
      ASSERT_EQ(y[m * p.ldy + n], static_cast<float>(want)) << "row " << m << " col " << n;
      ASSERT_EQ(yb[m * p.ldy + n], f32_to_bf16(static_cast<float>(want))) << "bf16 row " << m << " col " << n;
      nonzero |= want != 0.0;
    }
  EXPECT_TRUE(nonzero);
}

// accumulate adds the product to the old fp32 value (one more fp32 rounding); y_bf16 is the fp32 value
// rounded to bf16.
TEST(GemmBf16Ref, AccumulateAndBf16Output) {
  const Problem p = make_problem(1, 3, 9, 136, 11);
  std::vector<float> y0(p.M * p.ldy), y(p.M * p.ldy, 0.0f);
  std::mt19937 g(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& v : y0) v = nd(g);
  moesq::ops::gemm_bf16_ref(args_of(p, false, y.data(), nullptr, nullptr));  // y = x·Wᵀ
  std::vector<float> acc = y0;
  GemmBf16Args a = args_of(p, false, acc.data(), nullptr, nullptr);
  a.accumulate = true;
  moesq::ops::gemm_bf16_ref(a);
  std::vector<uint16_t> yb(p.M * p.ldy, 0);
  moesq::ops::gemm_bf16_ref(args_of(p, false, nullptr, yb.data(), nullptr));
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = 0; n < p.N; ++n) {
      const int64_t o = m * p.ldy + n;
      ASSERT_EQ(acc[o], y0[o] + y[o]) << "accumulate row " << m << " col " << n;
      ASSERT_EQ(yb[o], f32_to_bf16(y[o])) << "bf16 row " << m << " col " << n;
    }
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = p.N; n < p.ldy; ++n) ASSERT_EQ(acc[m * p.ldy + n], y0[m * p.ldy + n]) << "ldy padding";
}

TEST(GemmBf16Ref, RefusesBadArguments) {
  const Problem p = make_problem(1, 2, 4, 16, 1);
  std::vector<float> y(p.M * p.ldy);
  std::vector<uint16_t> yb(p.M * p.ldy);
  GemmBf16Args a = args_of(p, false, y.data(), nullptr, nullptr);
  a.K = 12;  // not a multiple of 8
  EXPECT_THROW(moesq::ops::gemm_bf16_ref(a), moesq::Error);
  a = args_of(p, false, y.data(), yb.data(), nullptr);  // two outputs
  EXPECT_THROW(moesq::ops::gemm_bf16_ref(a), moesq::Error);
  a = args_of(p, false, y.data(), nullptr, nullptr);
  a.ldy = p.N - 1;
  EXPECT_THROW(moesq::ops::gemm_bf16_ref(a), moesq::Error);
  a = args_of(p, false, nullptr, yb.data(), nullptr);
  a.accumulate = true;  // needs the fp32 output
  EXPECT_THROW(moesq::ops::gemm_bf16_ref(a), moesq::Error);
}

// With fused_topk the twin is gemm_bf16_ref then router_topk_ref on its logits (the GPU kernel's last
// CTA runs the same routing; bitwise against the two kernels in tests/gpu/test_engine_ops.cu). And the
// fused form's layout rules: its logits are this GEMM's output, dense (ldy = N = E), with a ticket.
TEST(GemmBf16Ref, FusedTopkIsTheGemmThenTheRouting) {
  Problem p = make_problem(1, 3, 16, 64, 9);
  p.ldy = p.N;
  std::vector<float> y(p.M * p.N), y2(p.M * p.N), w(p.M * 2), w2(p.M * 2);
  std::vector<int32_t> ids(p.M * 2), ids2(p.M * 2), counts(p.N, 5), ticket(1, 0);
  moesq::ops::RouterTopkArgs r;
  r.logits = y.data(), r.topk_ids = ids.data(), r.topk_w = w.data(), r.T = p.M, r.num_experts = 16, r.topk = 2;
  r.counts = counts.data();
  GemmBf16Args a = args_of(p, true, y.data(), nullptr, nullptr);
  a.fused_topk = &r, a.topk_ticket = ticket.data();
  moesq::ops::gemm_bf16_ref(a);
  GemmBf16Args b = args_of(p, true, y2.data(), nullptr, nullptr);
  moesq::ops::gemm_bf16_ref(b);
  moesq::ops::RouterTopkArgs r2 = r;
  r2.logits = y2.data(), r2.topk_ids = ids2.data(), r2.topk_w = w2.data(), r2.counts = nullptr;
  moesq::ops::router_topk_ref(r2);
  EXPECT_EQ(y, y2);
  EXPECT_EQ(ids, ids2);
  EXPECT_EQ(w, w2);
  EXPECT_EQ(counts, std::vector<int32_t>(p.N, 0));
  a.topk_ticket = nullptr;  // no ticket
  EXPECT_THROW(moesq::ops::gemm_bf16_ref(a), moesq::Error);
  a.topk_ticket = ticket.data(), a.ldy = p.N + 1;  // padded logits
  EXPECT_THROW(moesq::ops::gemm_bf16_ref(a), moesq::Error);
  a.ldy = p.N, r.logits = y2.data();  // another buffer's logits
  EXPECT_THROW(moesq::ops::gemm_bf16_ref(a), moesq::Error);
  r.logits = y.data(), a.accumulate = true;
  EXPECT_THROW(moesq::ops::gemm_bf16_ref(a), moesq::Error);
}

}  // namespace
