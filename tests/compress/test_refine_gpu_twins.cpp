// The GPU refinement's ops, through their CPU twins, against the CPU refinement they replace
// (refine/gumbel_mask.h, refine/lion.h, refine/objective.h): the same per-group code and the same fp32
// order, so
//   * gumbel_support_forward_ref (kGumbel, key k) = soft_mask_forward on gumbel_noise(R, k), bitwise
//     (π and W = Z ⊙ V); kNoiseFree = soft_mask_forward without noise; kArgmax = hard_mask; kFixed =
//     pattern_mask;
//   * gumbel_support_lion_ref = soft_mask_backward, then lion_step on A and on V, bitwise;
//   * a step composed of the ops (support forward, fake_quant γ_gu/γ_down, cblas GEMMs, swiglu_train,
//     weighted_mse, swiglu_train backward, the support backward read out through Lion) reproduces
//     objective_grad's loss and its dA, dV on a small expert.
#include <gtest/gtest.h>
#include <cblas.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "compress/refine/gumbel_mask.h"
#include "compress/refine/lion.h"
#include "compress/refine/objective.h"
#include "format/nvfp4.h"
#include "ops/fake_quant/fake_quant.h"
#include "ops/gumbel_support/gumbel_support.h"
#include "ops/swiglu_train/swiglu_train.h"
#include "ops/weighted_mse/weighted_mse.h"

namespace {

using namespace moesq;
using namespace moesq::compress::refine;
using ops::SupportMode;

// The composed step runs the same fp32 expressions as objective_grad; only its weight-gradient GEMMs
// differ (beta = 0 into a fresh buffer here, beta = 1 onto zeros there), which BLAS may sum in another
// order: relative Frobenius 1e-6 on the gradients (a wrong term is O(1)). The forward GEMMs are the
// same calls on the same data, so the loss agrees to rounding of the final scaling.
constexpr double kComposedGradRelFrob = 1e-6;
constexpr double kComposedLossRelTol = 1e-12;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> normal(size_t n, float std, std::mt19937_64& g) {
  std::normal_distribution<float> nd(0.0f, std);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(g);
  return x;
}

double rel_frobenius(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

TEST(RefineGpuTwins, SupportForwardEqualsSoftMaskForward) {
  for (const int64_t R : {1, 257, 1024}) {
    std::mt19937_64 g(R);
    const auto A = normal(R * kNumPatterns, 0.02f, g), V = normal(R * kGroup, 1.0f, g);
    const double kappa = 180.0, tau = 1.3;
    const uint64_t key = rng_key(3, 11, kRngGumbel, 5, kUp);
    std::vector<float> G(R * kNumPatterns), pi(R * kNumPatterns), Z(R * kGroup), W(R * kGroup);
    gumbel_noise(R, key, G.data());
    for (const SupportMode mode : {SupportMode::kGumbel, SupportMode::kNoiseFree}) {
      soft_mask_forward(A.data(), mode == SupportMode::kGumbel ? G.data() : nullptr, R, kappa, tau, pi.data(), Z.data());
      for (int64_t i = 0; i < R * kGroup; ++i) W[i] = Z[i] * V[i];
      std::vector<float> opi(R * kNumPatterns, -1.0f), oW(R * kGroup, -1.0f);
      ops::gumbel_support_forward_ref({.R = R, .mode = mode, .A = A.data(), .V = V.data(), .kappa = kappa, .tau = tau,
                                       .key = key, .pi = opi.data(), .W = oW.data()});
      EXPECT_TRUE(same_bits(opi, pi)) << "pi, R=" << R << " mode " << static_cast<int>(mode);
      EXPECT_TRUE(same_bits(oW, W)) << "W, R=" << R << " mode " << static_cast<int>(mode);
    }
    std::vector<uint8_t> pat(R), opat(R, 99);
    hard_mask(A.data(), R, pat.data(), Z.data());
    for (int64_t i = 0; i < R * kGroup; ++i) W[i] = Z[i] * V[i];
    std::vector<float> oW(R * kGroup, -1.0f);
    ops::gumbel_support_forward_ref(
        {.R = R, .mode = SupportMode::kArgmax, .A = A.data(), .V = V.data(), .W = oW.data(), .patterns = opat.data()});
    EXPECT_EQ(opat, pat) << "R=" << R;
    EXPECT_TRUE(same_bits(oW, W)) << "argmax W, R=" << R;
    for (auto& p : pat) p = static_cast<uint8_t>((p + 1) % kNumPatterns);
    pattern_mask(pat.data(), R, Z.data());
    for (int64_t i = 0; i < R * kGroup; ++i) W[i] = Z[i] * V[i];
    ops::gumbel_support_forward_ref(
        {.R = R, .mode = SupportMode::kFixed, .V = V.data(), .fixed = pat.data(), .W = oW.data()});
    EXPECT_TRUE(same_bits(oW, W)) << "fixed W, R=" << R;
  }
}

TEST(RefineGpuTwins, SupportLionEqualsSoftMaskBackwardThenLionStep) {
  const LionConfig cfg{.beta1 = 0.9, .beta2 = 0.95, .weight_decay = 1.0};
  const double kappa = 120.0, tau = 1.7, lr_A = 2e-3, lr_V = 4e-4;
  for (const int64_t R : {1, 300})
    for (const bool relaxed : {true, false}) {
      std::mt19937_64 g(10 * R + relaxed);
      const auto A0 = normal(R * kNumPatterns, 0.02f, g), V0 = normal(R * kGroup, 1.0f, g);
      const auto dW = normal(R * kGroup, 1e-3f, g);
      const auto mA0 = normal(R * kNumPatterns, 1e-2f, g), mV0 = normal(R * kGroup, 1e-3f, g);
      std::vector<uint8_t> fixed(R);
      for (auto& p : fixed) p = static_cast<uint8_t>(g() % kNumPatterns);
      std::vector<float> G(R * kNumPatterns), pi(R * kNumPatterns), Z(R * kGroup);
      gumbel_noise(R, rng_key(1, 2, kRngGumbel, 3, kGate), G.data());
      if (relaxed) soft_mask_forward(A0.data(), G.data(), R, kappa, tau, pi.data(), Z.data());
      else pattern_mask(fixed.data(), R, Z.data());
      // The CPU refinement's step.
      std::vector<float> A = A0, V = V0, mA = mA0, mV = mV0, dA(R * kNumPatterns), dV(R * kGroup);
      soft_mask_backward(dW.data(), V.data(), Z.data(), relaxed ? pi.data() : nullptr, R, kappa, tau,
                         relaxed ? dA.data() : nullptr, dV.data());
      if (relaxed) lion_step(A.data(), mA.data(), dA.data(), R * kNumPatterns, lr_A, cfg);
      lion_step(V.data(), mV.data(), dV.data(), R * kGroup, lr_V, cfg);
      // The op's twin.
      std::vector<float> oA = A0, oV = V0, omA = mA0, omV = mV0;
      ops::gumbel_support_lion_ref({.R = R, .dW = dW.data(), .pi = relaxed ? pi.data() : nullptr,
                                    .fixed = fixed.data(), .kappa = kappa, .tau = tau,
                                    .A = relaxed ? oA.data() : nullptr, .V = oV.data(),
                                    .mom_A = relaxed ? omA.data() : nullptr, .mom_V = omV.data(), .lr_A = lr_A,
                                    .lr_V = lr_V, .beta1 = cfg.beta1, .beta2 = cfg.beta2,
                                    .weight_decay = cfg.weight_decay});
      EXPECT_TRUE(same_bits(oV, V)) << "V, R=" << R << " relaxed=" << relaxed;
      EXPECT_TRUE(same_bits(omV, mV)) << "mom_V, R=" << R << " relaxed=" << relaxed;
      EXPECT_TRUE(same_bits(oA, A)) << "A, R=" << R << " relaxed=" << relaxed;
      EXPECT_TRUE(same_bits(omA, mA)) << "mom_A, R=" << R << " relaxed=" << relaxed;
      EXPECT_FALSE(same_bits(V, V0)) << "the step moved V";
    }
}

// One training step of a small expert composed of the ops' twins (what the CUDA backend runs, with
// cblas in place of cuBLAS) against objective_grad with quantization on.
TEST(RefineGpuTwins, ComposedStepReproducesObjectiveGrad) {
  const int64_t H = 64, I = 32, m = 40;
  const double kappa = 150.0, tau = 1.5;
  std::mt19937_64 g(2026);
  auto X = normal(m * H, 1.0f, g);
  for (int64_t i = 0; i < m; ++i) format::quantize_activation_row(X.data() + i * H, H, 32);  // Xq
  const auto Y_ref = normal(m * H, 0.3f, g);
  std::vector<float> w(m);
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  double sw = 0.0;
  for (auto& v : w) sw += (v = ud(g) * ud(g));
  const double inv_norm = 1.0 / (sw * H);
  const int64_t N[3] = {I, I, H}, K[3] = {H, H, I};
  std::array<ProjState<float>, 3> P;
  std::array<std::vector<float>, 3> G;
  std::array<uint64_t, 3> key;
  for (int j = 0; j < 3; ++j) {
    P[j].N = N[j], P[j].K = K[j];
    P[j].A = normal(P[j].groups() * kNumPatterns, 0.02f, g);
    P[j].V = normal(N[j] * K[j], 0.1f, g);
    key[j] = rng_key(1, 7, kRngGumbel, 0, j);
    G[j].resize(P[j].groups() * kNumPatterns);
    gumbel_noise(P[j].groups(), key[j], G[j].data());
  }
  ObjectiveInput<float> in;
  in.m = m, in.H = H, in.I = I, in.X = X.data(), in.Y_ref = Y_ref.data(), in.w = w.data(), in.inv_norm = inv_norm;
  in.G = {G[0].data(), G[1].data(), G[2].data()};
  in.kappa = kappa, in.tau = tau, in.act_block = 32;
  std::array<ProjState<float>, 3> grad;
  ObjectiveWorkspace ws;
  const double loss = objective_grad(in, P, /*quant=*/true, /*micro_batch=*/m, &grad, ws);

  // The composed step. Forward: supports, W̃ = Q_w(Z ⊙ V) (gate|up one tensor γ), a|b, Q_a(h), Ŷ.
  std::array<std::vector<float>, 3> pi, W;
  for (int j = 0; j < 3; ++j) {
    pi[j].resize(P[j].A.size());
    W[j].resize(P[j].V.size());
    ops::gumbel_support_forward_ref({.R = P[j].groups(), .mode = SupportMode::kGumbel, .A = P[j].A.data(),
                                     .V = P[j].V.data(), .kappa = kappa, .tau = tau, .key = key[j],
                                     .pi = pi[j].data(), .W = W[j].data()});
  }
  std::vector<float> W_gu(W[kGate]);
  W_gu.insert(W_gu.end(), W[kUp].begin(), W[kUp].end());  // [2I, H]
  std::vector<float> W_down = W[kDown];                      // [H, I]
  ops::fake_quant_ref({.x = W_gu.data(), .rows = 2 * I, .K = H, .block = 32, .per_row = false});
  ops::fake_quant_ref({.x = W_down.data(), .rows = H, .K = I, .block = 32, .per_row = false});
  std::vector<float> gu(m * 2 * I), h(m * I), y(m * H), dy(m * H), dh(m * I), dgu(m * 2 * I);
  std::vector<double> row_loss(m);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, 2 * I, H, 1.0f, X.data(), H, W_gu.data(), H, 0.0f,
              gu.data(), 2 * I);
  ops::swiglu_train_forward_ref({.rows = m, .I = I, .ab = gu.data(), .h = h.data(), .quantize = true, .block = 32});
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, H, I, 1.0f, h.data(), I, W_down.data(), I, 0.0f, y.data(), H);
  ops::weighted_mse_ref({.rows = m, .H = H, .y = y.data(), .y_ref = Y_ref.data(), .w = w.data(), .inv_norm = inv_norm,
                         .dy = dy.data(), .row_loss = row_loss.data()});
  double composed_loss = 0.0;
  for (double l : row_loss) composed_loss += l;
  composed_loss *= inv_norm;
  EXPECT_GT(loss, 0.0);
  EXPECT_NEAR(composed_loss, loss, kComposedLossRelTol * loss);

  // Backward: dW̃_down = dŶᵀ·Q_a(h), dh = dŶ·W̃_down, da|db, d[W̃_gate; W̃_up] = [da|db]ᵀ·Xq, then the
  // support backward; β1 = β2 = λ = 0 makes Lion's momentum the gradient itself.
  std::vector<float> dW_down(H * I), dW_gu(2 * I * H);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, I, m, 1.0f, dy.data(), H, h.data(), I, 0.0f, dW_down.data(), I);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, I, H, 1.0f, dy.data(), H, W_down.data(), I, 0.0f, dh.data(), I);
  ops::swiglu_train_backward_ref({.rows = m, .I = I, .ab = gu.data(), .dh = dh.data(), .dab = dgu.data()});
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, 2 * I, H, m, 1.0f, dgu.data(), 2 * I, X.data(), H, 0.0f,
              dW_gu.data(), H);
  const float* dW[3] = {dW_gu.data(), dW_gu.data() + I * H, dW_down.data()};
  for (int j = 0; j < 3; ++j) {
    std::vector<float> A = P[j].A, V = P[j].V, gA(A.size(), 0.0f), gV(V.size(), 0.0f);
    ops::gumbel_support_lion_ref({.R = P[j].groups(), .dW = dW[j], .pi = pi[j].data(), .kappa = kappa, .tau = tau,
                                  .A = A.data(), .V = V.data(), .mom_A = gA.data(), .mom_V = gV.data(), .lr_A = 1e-3,
                                  .lr_V = 1e-3, .beta1 = 0.0, .beta2 = 0.0, .weight_decay = 0.0});
    EXPECT_LE(rel_frobenius(gA, grad[j].A), kComposedGradRelFrob) << "dA of projection " << j;
    EXPECT_LE(rel_frobenius(gV, grad[j].V), kComposedGradRelFrob) << "dV of projection " << j;
    double norm = 0.0;
    for (float v : grad[j].A) norm += std::fabs(v);
    EXPECT_GT(norm, 0.0) << "projection " << j;
  }
}
