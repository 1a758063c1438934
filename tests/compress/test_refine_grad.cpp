// Gradient checks of the refinement objective (refine/objective.h): every gradient — dA and dV of
// gate, up and down — against central finite differences in float64 on a small expert.
//
// How the quantizers are handled: Q_w and Q_a are piecewise constant, so finite differences of the
// real (quantized) loss are zero or infinite, not the STE gradient. Two checks cover it:
//  * kOff: quantizers are the identity → the plain chain rule through Gumbel-softmax, the mask, the
//    SwiGLU expert and the weighted loss is checked exactly;
//  * kFrozen: the quantization residuals r = Q(x) − x of the current point are captured and frozen,
//    Q(x) := x + r. That function equals the quantized loss at the point (asserted) and its exact
//    gradient there IS the straight-through gradient, so FD of it checks the kSte backward
//    (quantized weights and activations inside all three GEMMs).
// Then the fast float path (cblas, micro-batched) is compared with the reference on the same inputs.
// Both checks also run on the gpt-oss expert variant (biases, clamped SwiGLU with an active clamp).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "compress/refine/objective.h"
#include "compress/refine/gumbel_mask.h"
#include "format/nvfp4.h"

using namespace moesq::compress::refine;

namespace {

// Central differences in float64 with step 1e-6 on O(1) losses: truncation error ~h²·L''' ≈ 1e-12,
// cancellation ~1e-16·L/h ≈ 1e-10. Per element: |fd − an| ≤ kFdAtol + kFdRtol·|an|.
constexpr double kFdStep = 1e-6;
constexpr double kFdAtol = 1e-8;
constexpr double kFdRtol = 1e-5;
// Whole-tensor relative Frobenius error of fd vs analytic.
constexpr double kFdFrobenius = 1e-6;
// Fast float path vs float64 reference, smooth surrogate: fp32 sums of ≤ 128 terms in different
// orders → relative Frobenius ~1e-6; 1e-4 leaves room without hiding a wrong term (those are O(1)).
constexpr double kFastVsRefSmooth = 1e-4;
// Fast float vs float reference with quantizers on: the same rounding decisions except when a
// reordered fp32 sum lands on the other side of an E2M1 tie (rare); 1e-3 relative Frobenius.
constexpr double kFastVsRefQuant = 1e-3;

struct Problem {
  int64_t m, H, I;
  std::vector<double> X, Y, w;               // [m,H], [m,H], [m]
  std::array<ProjState<double>, 3> P;
  std::array<std::vector<double>, 3> G;      // Gumbel noise
  std::array<std::vector<uint8_t>, 3> fixed; // patterns for the fixed-support variant
  double inv_norm;
  // gpt-oss expert variant (ObjectiveInput::b_*, clamped): biases [I], [I], [H]; empty = plain SwiGLU.
  std::vector<double> b_gate, b_up, b_down;
};

// The clamp limit of the variant problems: small enough (activations are O(1)) that both clamps act
// on some elements, so the zero-gradient branches are exercised.
constexpr double kVariantLimit = 1.0;

Problem make_problem(int64_t m, int64_t H, int64_t I, uint64_t seed, bool variant = false) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.05, 1.0);
  Problem p{m, H, I, {}, {}, {}, {}, {}, {}, 0.0, {}, {}, {}};
  p.X.resize(m * H);
  p.Y.resize(m * H);
  p.w.resize(m);
  for (auto& x : p.X) x = nd(rng);
  // Put X on the NVFP4 activation grid, as the refinement loop does (Q_a on the inputs once).
  std::vector<float> row(H);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t k = 0; k < H; ++k) row[k] = static_cast<float>(p.X[i * H + k]);
    moesq::format::quantize_activation_row(row.data(), H, 32);
    for (int64_t k = 0; k < H; ++k) p.X[i * H + k] = row[k];
  }
  for (auto& y : p.Y) y = 0.3 * nd(rng);
  double sw = 0;
  for (auto& w : p.w) sw += (w = ud(rng) * ud(rng));  // g^2-like row weights
  p.inv_norm = 1.0 / (sw * H);
  const int64_t N[3] = {I, I, H}, K[3] = {H, H, I};
  for (int j = 0; j < 3; ++j) {
    p.P[j].N = N[j];
    p.P[j].K = K[j];
    const int64_t R = N[j] * K[j] / 8;
    p.P[j].V.resize(N[j] * K[j]);
    // Scale 1/sqrt(K) keeps the activations O(1) so the SwiGLU is not in its linear regime.
    for (auto& v : p.P[j].V) v = nd(rng) / std::sqrt(static_cast<double>(K[j]));
    p.P[j].A.resize(R * 6);
    for (auto& a : p.P[j].A) a = 0.5 * nd(rng);
    p.G[j].resize(R * 6);
    gumbel_noise(R, rng_key(seed, 7, kRngGumbel, 0, j), p.G[j].data());
    p.fixed[j].resize(R);
    for (auto& f : p.fixed[j]) f = static_cast<uint8_t>(rng() % 6);
  }
  if (variant) {
    p.b_gate.resize(I);
    p.b_up.resize(I);
    p.b_down.resize(H);
    for (auto* b : {&p.b_gate, &p.b_up, &p.b_down})
      for (auto& v : *b) v = 0.5 * nd(rng);
  }
  return p;
}

ObjectiveInput<double> input_of(const Problem& p, bool fixed_support) {
  ObjectiveInput<double> in;
  in.m = p.m;
  in.H = p.H;
  in.I = p.I;
  in.X = p.X.data();
  in.Y_ref = p.Y.data();
  in.w = p.w.data();
  in.inv_norm = p.inv_norm;
  in.kappa = 2.0;  // moderate κ/τ: π stays away from one-hot, so dA is not vanishingly small
  in.tau = 1.5;
  for (int j = 0; j < 3; ++j) {
    in.G[j] = p.G[j].data();
    if (fixed_support) in.fixed[j] = p.fixed[j].data();
  }
  if (!p.b_gate.empty()) {
    in.b_gate = p.b_gate.data();
    in.b_up = p.b_up.data();
    in.b_down = p.b_down.data();
    in.clamped = true;
    in.limit = kVariantLimit;
  }
  return in;
}

double frob_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// Checks every coordinate of dA and dV of all three projections against central differences.
void check_fd(const Problem& prob, bool fixed_support, QuantMode mode) {
  static const char* names[3] = {"gate", "up", "down"};
  const ObjectiveInput<double> in = input_of(prob, fixed_support);
  auto P = prob.P;
  QuantResiduals<double> res;
  std::array<ProjState<double>, 3> grad;
  double loss;
  if (mode == QuantMode::kFrozen) {
    const double ste_loss = objective_ref(in, P, QuantMode::kSte, &res, &grad);
    loss = objective_ref(in, P, QuantMode::kFrozen, &res, nullptr);
    EXPECT_NEAR(loss, ste_loss, 1e-12 * std::fabs(ste_loss)) << "frozen surrogate ≠ quantized loss";
  } else {
    loss = objective_ref(in, P, mode, nullptr, &grad);
  }
  ASSERT_GT(loss, 0.0);
  for (int j = 0; j < 3; ++j) {
    for (int which = 0; which < 2; ++which) {  // 0: A, 1: V
      if (which == 0 && fixed_support) {
        EXPECT_TRUE(grad[j].A.empty()) << names[j] << ": fixed support must have no dA";
        continue;
      }
      std::vector<double>& param = which == 0 ? P[j].A : P[j].V;
      const std::vector<double>& an = which == 0 ? grad[j].A : grad[j].V;
      ASSERT_EQ(an.size(), param.size());
      std::vector<double> fd(param.size());
      double max_abs = 0;
      int64_t first_bad = -1;
      for (size_t i = 0; i < param.size(); ++i) {
        const double keep = param[i];
        param[i] = keep + kFdStep;
        const double lp = objective_ref(in, P, mode, &res, nullptr);
        param[i] = keep - kFdStep;
        const double lm = objective_ref(in, P, mode, &res, nullptr);
        param[i] = keep;
        fd[i] = (lp - lm) / (2 * kFdStep);
        max_abs = std::max(max_abs, std::fabs(an[i]));
        if (first_bad < 0 && std::fabs(fd[i] - an[i]) > kFdAtol + kFdRtol * std::fabs(an[i]))
          first_bad = static_cast<int64_t>(i);
      }
      EXPECT_GT(max_abs, 1e-6) << names[j] << (which ? " dV" : " dA") << " is all ~zero";
      EXPECT_LT(first_bad, 0) << names[j] << (which ? " dV" : " dA") << " [N=" << P[j].N
                              << ", K=" << P[j].K << "] first bad index " << first_bad
                              << ": fd=" << (first_bad >= 0 ? fd[first_bad] : 0.0)
                              << " analytic=" << (first_bad >= 0 ? an[first_bad] : 0.0);
      EXPECT_LT(frob_rel(fd, an), kFdFrobenius) << names[j] << (which ? " dV" : " dA");
    }
  }
}

}  // namespace

TEST(RefineGrad, FiniteDifferencesSmoothSurrogate) {
  check_fd(make_problem(5, 32, 32, 11), false, QuantMode::kOff);
}

TEST(RefineGrad, FiniteDifferencesStraightThrough) {
  check_fd(make_problem(5, 32, 32, 12), false, QuantMode::kFrozen);
}

TEST(RefineGrad, FiniteDifferencesFixedSupport) {  // the V-only ablation's gradient
  check_fd(make_problem(4, 32, 32, 13), true, QuantMode::kFrozen);
}

// gpt-oss's expert (biases, clamped SwiGLU) in the objective: the same checks.
TEST(RefineGrad, FiniteDifferencesClampedBiasedExpert) {
  check_fd(make_problem(5, 32, 32, 15, true), false, QuantMode::kOff);
}

TEST(RefineGrad, FiniteDifferencesClampedBiasedExpertStraightThrough) {
  check_fd(make_problem(5, 32, 32, 16, true), false, QuantMode::kFrozen);
}

TEST(RefineGrad, ClampAndBiasesAct) {
  const Problem p = make_problem(5, 32, 32, 15, true);
  ObjectiveInput<double> in = input_of(p, false);
  const double clamped = objective_ref(in, p.P, QuantMode::kOff, nullptr, nullptr);
  in.limit = 1e9;
  const double open = objective_ref(in, p.P, QuantMode::kOff, nullptr, nullptr);
  in.b_gate = in.b_up = in.b_down = nullptr;
  const double unbiased = objective_ref(in, p.P, QuantMode::kOff, nullptr, nullptr);
  EXPECT_GT(std::fabs(clamped - open), 1e-3 * clamped) << "the clamp must bite at limit " << kVariantLimit;
  EXPECT_GT(std::fabs(open - unbiased), 1e-3 * open) << "the biases must matter";
}

TEST(RefineGrad, SteIsNotTheSmoothGradient) {
  // The quantizers must actually act: the STE loss differs from the smooth one (else the kFrozen
  // check above would not test anything beyond kOff).
  const Problem p = make_problem(5, 32, 32, 14);
  const ObjectiveInput<double> in = input_of(p, false);
  const double smooth = objective_ref(in, p.P, QuantMode::kOff, nullptr, nullptr);
  const double ste = objective_ref(in, p.P, QuantMode::kSte, nullptr, nullptr);
  EXPECT_GT(std::fabs(smooth - ste), 1e-4 * smooth);
}

namespace {
// Fast float path vs the reference on one problem (ragged micro-batches: m = 37, micro-batch 16).
void check_fast(bool quant, bool fixed_support, uint64_t seed, bool variant = false) {
  const Problem p = make_problem(37, 64, 32, seed, variant);
  const ObjectiveInput<double> ind = input_of(p, fixed_support);
  std::vector<float> Xf(p.X.begin(), p.X.end()), Yf(p.Y.begin(), p.Y.end()), wf(p.w.begin(), p.w.end());
  std::array<std::vector<float>, 3> Gf;
  std::array<ProjState<float>, 3> Pf;
  ObjectiveInput<float> inf;
  inf.m = p.m;
  inf.H = p.H;
  inf.I = p.I;
  inf.X = Xf.data();
  inf.Y_ref = Yf.data();
  inf.w = wf.data();
  inf.inv_norm = p.inv_norm;
  inf.kappa = ind.kappa;
  inf.tau = ind.tau;
  const std::vector<float> bg(p.b_gate.begin(), p.b_gate.end()), bu(p.b_up.begin(), p.b_up.end()),
      bd(p.b_down.begin(), p.b_down.end());
  if (variant) {
    inf.b_gate = bg.data();
    inf.b_up = bu.data();
    inf.b_down = bd.data();
    inf.clamped = true;
    inf.limit = kVariantLimit;
  }
  for (int j = 0; j < 3; ++j) {
    Gf[j].assign(p.G[j].begin(), p.G[j].end());
    inf.G[j] = Gf[j].data();
    inf.fixed[j] = ind.fixed[j];
    Pf[j].N = p.P[j].N;
    Pf[j].K = p.P[j].K;
    Pf[j].A.assign(p.P[j].A.begin(), p.P[j].A.end());
    Pf[j].V.assign(p.P[j].V.begin(), p.P[j].V.end());
  }
  std::array<ProjState<float>, 3> gfast, gref_f;
  std::array<ProjState<double>, 3> gref_d;
  ObjectiveWorkspace ws;
  const double lfast = objective_grad(inf, Pf, quant, 16, &gfast, ws);
  double lref;
  if (quant) {  // same precision, same quantizer inputs up to summation order
    lref = objective_ref(inf, Pf, QuantMode::kSte, nullptr, &gref_f);
    for (int j = 0; j < 3; ++j) {
      gref_d[j].A.assign(gref_f[j].A.begin(), gref_f[j].A.end());
      gref_d[j].V.assign(gref_f[j].V.begin(), gref_f[j].V.end());
    }
  } else {
    lref = objective_ref(ind, p.P, QuantMode::kOff, nullptr, &gref_d);
  }
  const double tol = quant ? kFastVsRefQuant : kFastVsRefSmooth;
  EXPECT_NEAR(lfast, lref, tol * lref) << "m=37 H=64 I=32 quant=" << quant;
  for (int j = 0; j < 3; ++j) {
    ASSERT_EQ(gfast[j].V.size(), gref_d[j].V.size());
    ASSERT_EQ(gfast[j].A.size(), gref_d[j].A.size());
    std::vector<double> fv(gfast[j].V.begin(), gfast[j].V.end()), fa(gfast[j].A.begin(), gfast[j].A.end());
    EXPECT_LT(frob_rel(fv, gref_d[j].V), tol) << "projection " << j << " dV";
    if (!fixed_support) EXPECT_LT(frob_rel(fa, gref_d[j].A), tol) << "projection " << j << " dA";
  }
}
}  // namespace

TEST(RefineGrad, FastMatchesReferenceSmooth) { check_fast(false, false, 21); }
TEST(RefineGrad, FastMatchesReferenceQuantized) { check_fast(true, false, 22); }
TEST(RefineGrad, FastMatchesReferenceFixedSupport) { check_fast(true, true, 23); }
TEST(RefineGrad, FastMatchesReferenceClampedBiasedSmooth) { check_fast(false, false, 24, true); }
TEST(RefineGrad, FastMatchesReferenceClampedBiasedQuantized) { check_fast(true, false, 25, true); }

TEST(RefineGrad, SoftMaskIsAConvexCombinationOfPatterns) {
  // Eq. 2: every group's Z sums to 4 (each pattern keeps 4 of 8) and lies in [0, 1]; at τ → 0 it
  // becomes the one-hot mask of argmax(κA + G).
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t R = 64;
  std::vector<float> A(R * 6), G(R * 6), pi(R * 6), Z(R * 8), Zh(R * 8), Gk(R * 6);
  for (auto& a : A) a = nd(rng);
  gumbel_noise(R, rng_key(5, 0, kRngGumbel, 0, 0), G.data());
  soft_mask_forward(A.data(), G.data(), R, 3.0, 0.7, pi.data(), Z.data());
  for (int64_t r = 0; r < R; ++r) {
    float s = 0;
    for (int j = 0; j < 8; ++j) {
      EXPECT_GE(Z[r * 8 + j], 0.0f);
      EXPECT_LE(Z[r * 8 + j], 1.0f + 1e-6f);
      s += Z[r * 8 + j];
    }
    EXPECT_NEAR(s, 4.0f, 1e-5f) << "group " << r;
  }
  soft_mask_forward(A.data(), G.data(), R, 3.0, 1e-4, pi.data(), Z.data());
  for (int64_t i = 0; i < R * 6; ++i) Gk[i] = 3.0f * A[i] + G[i];
  std::vector<uint8_t> pat(R);
  hard_mask(Gk.data(), R, pat.data(), Zh.data());
  for (int64_t i = 0; i < R * 8; ++i) EXPECT_NEAR(Z[i], Zh[i], 1e-6f) << "element " << i;
}
