// The GPU SGPTQ (compress/sgptq_cuda.h) and its column op (ops/sgptq_columns):
//   * the kernel against its `_ref` twin on the same block of the same inputs, bit for bit;
//   * sgptq_expert_cuda against the CPU solver (sgptq_expert on the CPU) on a small correlated expert:
//     nearly the same codes (the GEMM, DSYRK and Cholesky summation orders differ, so a few E2M1
//     roundings flip at ties and propagate), the same GPTQ loss within a named tolerance, the same
//     dead inputs and fallbacks; two GPU runs give the same bytes;
//   * the fallbacks (no tokens) equal to the CPU's, bit for bit (identity Hessian: no error propagated).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "compress/hessian.h"
#include "compress/methods/sgptq_expert.h"
#include "compress/pipeline.h"
#include "compress/sgptq_cuda.h"
#include "core/cuda/dev_buf.cuh"
#include "format/nvfp4.h"
#include "model/decoder.h"
#include "ops/sgptq_columns/sgptq_columns.h"
#include "support/correlated_layer.h"
#include "support/gpu_test_main.h"

namespace {

using namespace moesq;
namespace mc = moesq::compress;

// GPU vs CPU solve of the same expert (fp64 throughout; different summation orders).
constexpr double kMinSameCodes = 0.99;   // value codes, patterns and scale codes equal
constexpr double kLossRelTol = 1e-3;     // GPTQ proxy loss

template <typename T>
double same_fraction(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t same = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) same += a[i] == b[i];
  return a.empty() ? 1.0 : static_cast<double>(same) / static_cast<double>(a.size());
}

TEST(SgptqColumnsKernel, MatchesTheTwinBitwise) {
  const int64_t N = 100, K = 256;  // N not a multiple of the CTA's rows
  const test::CorrelatedLayer l = test::correlated_layer(N, K, 1024, 11);
  mc::Hessian h = mc::accumulate_hessian(l.X.data(), l.n, K);
  for (int64_t k = 0; k < K; ++k) h.H[k * K + k] += 0.01;
  std::vector<double> U;
  ASSERT_TRUE(mc::inverse_cholesky_upper(h.H, K, U));
  const float gamma = format::nvfp4_tensor_scale(format::amax_abs(l.W.data(), l.W.size()));
  for (const auto& [b0, b1, choose, from] : {std::tuple<int64_t, int64_t, bool, int64_t>{0, 128, true, 0},
                                             {128, 256, true, 0}, {64, 192, false, 100},
                                             {0, 256, true, 0}}) {  // wider than 128: the global-memory kernel
    std::vector<double> Wt(K * N), err((b1 - b0) * N, -1.0), loss(N, 0.25);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t c = 0; c < K; ++c) Wt[c * N + r] = l.W[r * K + c];
    std::vector<uint8_t> pat = format::magnitude_patterns(l.W.data(), N, K), sc(N * K / 32, 0), vc(N * K / 2, 0);
    std::vector<float> dense(N * K, 0.0f), deq(N * K, 0.0f);
    DevBuf<double> dWt(Wt), dU(U), derr(err), dloss(loss);
    DevBuf<uint8_t> dpat(pat), dsc(sc), dvc(vc);
    DevBuf<float> ddense(dense), ddeq(deq);
    DevBuf<int32_t> dbad(std::vector<int32_t>{0});
    ops::SgptqColumnsArgs a{.N = N, .K = K, .b0 = b0, .b1 = b1, .Wt = Wt.data(), .U = U.data(), .gamma = gamma,
                            .choose = choose, .pattern_at_group = true, .gptq_from = from, .patterns = pat.data(),
                            .scale_codes = sc.data(), .value_codes = vc.data(), .dense_rounded = dense.data(),
                            .dequant = deq.data(), .err = err.data(), .row_loss = loss.data(), .nonfinite = nullptr};
    ops::SgptqColumnsArgs d = a;
    d.Wt = dWt.p;
    d.U = dU.p;
    d.patterns = dpat.p;
    d.scale_codes = dsc.p;
    d.value_codes = dvc.p;
    d.dense_rounded = ddense.p;
    d.dequant = ddeq.p;
    d.err = derr.p;
    d.row_loss = dloss.p;
    d.nonfinite = dbad.p;
    ops::sgptq_columns_ref(a);
    ops::sgptq_columns(d, nullptr);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(dWt.download(), Wt) << "block " << b0;
    EXPECT_EQ(derr.download(), err);
    EXPECT_EQ(dloss.download(), loss);
    EXPECT_EQ(dpat.download(), pat);
    EXPECT_EQ(dsc.download(), sc);
    EXPECT_EQ(dvc.download(), vc);
    EXPECT_EQ(ddense.download(), dense);
    EXPECT_EQ(ddeq.download(), deq);
    EXPECT_EQ(dbad.download()[0], 0);
  }
}

struct ExpertCase {
  int64_t H, I, n;
  model::ExpertWeights w;
  mc::ExpertCalib c;
  std::vector<float> y_ref;
};

ExpertCase make_case(int64_t H, int64_t I, int64_t n, uint32_t seed) {
  ExpertCase e{H, I, n, {}, {}, {}};
  const test::CorrelatedLayer l = test::correlated_layer(I, H, n, seed);
  e.w.gate = l.W;
  e.w.up = test::gaussian_vec(I * H, seed + 1);
  e.w.down = test::gaussian_vec(H * I, seed + 2, 0.5f);
  e.c.X = l.X;
  e.c.g.assign(static_cast<size_t>(n), 1.0f);
  e.c.n = n;
  return e;
}

mc::SgptqExpert solve(const ExpertCase& e, bool gpu, mc::ExpertReport& rep) {
  const mc::ExpertJob job{.w = e.w, .H = e.H, .I = e.I, .calib = e.c, .y_ref = e.y_ref, .variant = {},
                          .gs_gu = format::gate_up_tensor_scale(e.w.gate.data(), e.w.up.data(), e.I * e.H),
                          .gs_d = format::nvfp4_tensor_scale(format::amax_abs(e.w.down.data(), e.H * e.I)),
                          .names = {"gate", "up", "down"}};
  mc::SgptqOptions opt;
  if (gpu) opt.device = mc::sgptq_expert_cuda;
  return mc::sgptq_expert(job, opt, rep);
}

TEST(SgptqCuda, FollowsTheCpuSolverAndRepeatsItsBytes) {
  ExpertCase e = make_case(256, 128, 2048, 5);
  for (int64_t t = 0; t < e.n; ++t) e.c.X[t * e.H + 17] = 0.0f;  // a dead input
  mc::ExpertReport rc, rg, rg2;
  const mc::SgptqExpert cpu = solve(e, false, rc), gpu = solve(e, true, rg), again = solve(e, true, rg2);
  for (int p = 0; p < 3; ++p) {
    const mc::SgptqResult &a = cpu.proj[p], &b = gpu.proj[p];
    EXPECT_FALSE(b.fallback) << b.fallback_reason;
    EXPECT_EQ(a.dead_columns, b.dead_columns) << "projection " << p;
    EXPECT_GE(same_fraction(a.patterns, b.patterns), kMinSameCodes) << "projection " << p;
    EXPECT_GE(same_fraction(a.packed.values, b.packed.values), kMinSameCodes) << "projection " << p;
    EXPECT_GE(same_fraction(a.packed.scales, b.packed.scales), kMinSameCodes) << "projection " << p;
    EXPECT_NEAR(b.gptq_loss, a.gptq_loss, kLossRelTol * a.gptq_loss) << "projection " << p;
    const mc::SgptqResult& c = again.proj[p];
    EXPECT_EQ(c.packed.values, b.packed.values);
    EXPECT_EQ(c.packed.meta, b.packed.meta);
    EXPECT_EQ(c.packed.scales, b.packed.scales);
    EXPECT_EQ(c.dense_rounded, b.dense_rounded);
  }
  EXPECT_EQ(cpu.proj[0].dead_columns, 1);
}

TEST(SgptqCuda, FallbacksAreTheCpuSolversBitwise) {
  ExpertCase e = make_case(128, 64, 0, 9);  // no calibration tokens
  mc::ExpertReport rc, rg;
  const mc::SgptqExpert cpu = solve(e, false, rc), gpu = solve(e, true, rg);
  EXPECT_TRUE(rg.fallback);
  EXPECT_EQ(rg.note, rc.note);
  for (int p = 0; p < 3; ++p) {
    EXPECT_TRUE(gpu.proj[p].fallback);
    EXPECT_EQ(gpu.proj[p].fallback_reason, cpu.proj[p].fallback_reason);
    EXPECT_EQ(gpu.proj[p].packed.values, cpu.proj[p].packed.values) << "projection " << p;
    EXPECT_EQ(gpu.proj[p].packed.meta, cpu.proj[p].packed.meta);
    EXPECT_EQ(gpu.proj[p].packed.scales, cpu.proj[p].packed.scales);
    EXPECT_EQ(gpu.proj[p].dense_rounded, cpu.proj[p].dense_rounded);
  }
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
