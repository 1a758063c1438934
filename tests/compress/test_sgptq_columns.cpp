// The GPU SGPTQ's column op (ops/sgptq_columns) through its CPU twin, against the CPU solver it
// replaces (compress/sgptq.h): run over ONE block spanning all of K, the op is the plain-loop solver
// sgptq_ref (every column's error applied to every later column at once), so on the same damped
// Hessian factor it must give the same patterns, codes, rounded weights and packed tensor, bit for
// bit, and the same GPTQ loss up to the order of its sum (rows first vs columns first). With the
// support given (choose = false) and gptq_from > 0 it is gptq_fixed_support_ref. Shapes are small
// and the inputs fresh correlated layers (tests/support/correlated_layer.h).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "compress/hessian.h"
#include "compress/sgptq.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "ops/sgptq_columns/sgptq_columns.h"
#include "support/correlated_layer.h"

namespace {

using namespace moesq;
namespace mc = moesq::compress;

// The op sums ½e² per row, then the rows; the solver per column over rows: fp64 reassociation only.
constexpr double kLossRelTol = 1e-12;

struct OpRun {
  std::vector<uint8_t> patterns, scales, values;
  std::vector<float> dense, dequant;
  double loss = 0.0;
  format::Sparse48Tensor packed;
};

// U for H as sgptq's prepare builds it (no dead inputs here: the layer's inputs are dense).
std::vector<double> damped_factor(const mc::Hessian& h, double percdamp) {
  const int64_t K = h.K;
  std::vector<double> H = h.H;
  double mean = 0.0;
  for (int64_t k = 0; k < K; ++k) mean += H[k * K + k];
  mean /= static_cast<double>(K);
  for (int64_t k = 0; k < K; ++k) H[k * K + k] += percdamp * mean;
  std::vector<double> U;
  EXPECT_TRUE(mc::inverse_cholesky_upper_ref(H, K, U));
  return U;
}

OpRun run_op(const std::vector<float>& W, int64_t N, int64_t K, const std::vector<double>& U, float gamma,
             const uint8_t* fixed, int64_t gptq_from) {
  OpRun o;
  std::vector<double> Wt(static_cast<size_t>(K * N)), err(static_cast<size_t>(K * N)), row_loss(N, 0.0);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < K; ++c) Wt[c * N + r] = W[r * K + c];
  o.patterns.assign(static_cast<size_t>(N * K / 8), 0);
  if (fixed) o.patterns.assign(fixed, fixed + N * K / 8);
  o.scales.resize(static_cast<size_t>(N * K / 32));
  o.values.resize(static_cast<size_t>(N * K / 2));
  o.dense.resize(static_cast<size_t>(N * K));
  o.dequant.resize(static_cast<size_t>(N * K));
  int32_t bad = 0;
  ops::sgptq_columns_ref({.N = N, .K = K, .b0 = 0, .b1 = K, .Wt = Wt.data(), .U = U.data(), .gamma = gamma,
                          .choose = fixed == nullptr, .pattern_at_group = true, .gptq_from = gptq_from,
                          .patterns = o.patterns.data(), .scale_codes = o.scales.data(), .value_codes = o.values.data(),
                          .dense_rounded = o.dense.data(), .dequant = o.dequant.data(), .err = err.data(),
                          .row_loss = row_loss.data(), .nonfinite = &bad});
  EXPECT_EQ(bad, 0);
  for (double l : row_loss) o.loss += l;
  o.packed = mc::sgptq_pack(N, K, gamma, o.patterns, o.scales, o.values);
  return o;
}

void expect_same(const OpRun& o, const mc::SgptqResult& want) {
  EXPECT_EQ(o.patterns, want.patterns);
  EXPECT_EQ(o.dense, want.dense_rounded);
  EXPECT_EQ(o.packed.values, want.packed.values);
  EXPECT_EQ(o.packed.meta, want.packed.meta);
  EXPECT_EQ(o.packed.scales, want.packed.scales);
  EXPECT_NEAR(o.loss, want.gptq_loss, kLossRelTol * want.gptq_loss);
  std::vector<float> deq(o.dequant.size());
  format::sparse48_dequantize(want.packed, deq.data());
  EXPECT_EQ(o.dequant, deq);  // kept: the rounded value, pruned: 0
}

float tensor_scale(const std::vector<float>& W) { return format::nvfp4_tensor_scale(format::amax_abs(W.data(), W.size())); }

TEST(SgptqColumns, OneBlockOverAllColumnsIsThePlainLoopSolver) {
  for (const auto& [N, K, seed] : {std::tuple<int64_t, int64_t, uint32_t>{24, 64, 1}, {40, 128, 2}, {7, 96, 3}}) {
    const test::CorrelatedLayer l = test::correlated_layer(N, K, 512, seed);
    const mc::Hessian h = mc::accumulate_hessian(l.X.data(), l.n, K);
    const mc::SgptqOptions opt;
    const float gamma = tensor_scale(l.W);
    const mc::SgptqResult want = mc::sgptq_ref(l.W.data(), N, K, h, gamma, opt);
    ASSERT_FALSE(want.fallback);
    expect_same(run_op(l.W, N, K, damped_factor(h, opt.percdamp), gamma, nullptr, 0), want);
  }
}

TEST(SgptqColumns, GivenSupportAndRtnPrefixIsGptqFixedSupport) {
  const int64_t N = 32, K = 128;
  const test::CorrelatedLayer l = test::correlated_layer(N, K, 512, 7);
  const mc::Hessian h = mc::accumulate_hessian(l.X.data(), l.n, K);
  const mc::SgptqOptions opt;
  const float gamma = tensor_scale(l.W);
  const std::vector<uint8_t> patterns = format::magnitude_patterns(l.W.data(), N, K);
  for (int64_t from : {int64_t{0}, int64_t{40}, K}) {
    const mc::SgptqResult want = mc::gptq_fixed_support_ref(l.W.data(), N, K, h, gamma, patterns.data(), from, opt);
    expect_same(run_op(l.W, N, K, damped_factor(h, opt.percdamp), gamma, patterns.data(), from), want);
  }
}

TEST(SgptqColumns, RefusesBlocksThatAreNotWholeScaleBlocks) {
  std::vector<double> Wt(64 * 4), U(64 * 64), err(64 * 4), loss(4);
  std::vector<uint8_t> p(4 * 8), s(4 * 2), v(4 * 32);
  std::vector<float> d(4 * 64);
  ops::SgptqColumnsArgs a{.N = 4, .K = 64, .b0 = 16, .b1 = 48, .Wt = Wt.data(), .U = U.data(), .gamma = 1.0f,
                          .patterns = p.data(), .scale_codes = s.data(), .value_codes = v.data(), .dense_rounded = d.data(),
                          .err = err.data(), .row_loss = loss.data()};
  EXPECT_THROW(ops::sgptq_columns_ref(a), Error);
  a.b0 = 0;
  a.b1 = 96;  // past K
  EXPECT_THROW(ops::sgptq_columns_ref(a), Error);
  a.b1 = 64;
  a.gamma = 0.0f;
  EXPECT_THROW(ops::sgptq_columns_ref(a), Error);
}

}  // namespace
