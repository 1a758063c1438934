// CPU tests of ops::gumbel_support_forward_ref / gumbel_support_lion_ref (the GPU kernels' twins,
// tests/gpu/test_refine_ops.cu) against plain definitions of paper 002 Eq. 2 and Lion written here:
//   π = softmax((κ·A + G)/τ) in fp64 (G = −log(−log u), u the counter stream), Z_{2q} = Z_{2q+1} = Σ_{p ∋ q} π_p,
//   W = Z ⊙ V; argmax / fixed one-hot Z (bitwise); the backward dV = dW ⊙ Z, dA = (κ/τ)·π ⊙ (dπ − ⟨π, dπ⟩) in
//   fp64 (read out through Lion with β1 = β2 = λ = 0, where the momentum becomes the gradient) and the Lion
//   update in its fp32 order (bitwise); the pattern table equals format::kPatternPairs; the noise is Gumbel;
//   the e^-60 softmax cutoff; R = 0; the argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "format/nvfp4.h"
#include "ops/gumbel_support/gumbel_math.h"
#include "ops/gumbel_support/gumbel_support.h"
#include "support/expect_error.h"

namespace {

using namespace moesq::ops;
namespace gumbel = moesq::ops::gumbel;
namespace format = moesq::format;

constexpr int kG = gumbel::kGroup, kP = gumbel::kNumPatterns;

// fp32 softmax (exp and division rounded, fp32 noise, (κa + g)/τ rounded to fp32 from fp64) vs fp64:
// a few 2^-24 relative per term, and the rounding of u = (κa + g)/τ (|u| ≤ ~64, ulp 2^-18) moves
// π by up to π·2^-18 — so atol + rtol·|ref| with both 2^-16.
constexpr double kPiTol = 0x1p-16;
// The gradient (fp32 pair sums, a dot of 6 terms, the softmax Jacobian's cancellation dπ − ⟨π, dπ⟩)
// vs fp64: relative to the group's gradient scale (κ/τ)·max|dπ|.
constexpr double kGradRelTol = 0x1p-18;
// The sample mean of 60 000 Gumbel(0, 1) draws: standard error (π/√6)/√60000 ≈ 0.0052; 5 σ.
constexpr double kGumbelMeanTol = 0.026;
constexpr double kEulerGamma = 0.5772156649015329;

struct Params {
  int64_t R = 0;
  std::vector<float> A, V, dW;  // [R, 6], [R, 8], [R, 8]
  std::vector<uint8_t> fixed;   // [R]
};

Params random_params(int64_t R, uint64_t seed, float a_std = 0.02f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Params p{R, std::vector<float>(R * kP), std::vector<float>(R * kG), std::vector<float>(R * kG),
           std::vector<uint8_t>(R)};
  for (auto& v : p.A) v = a_std * nd(g);
  for (auto& v : p.V) v = nd(g);
  for (auto& v : p.dW) v = 1e-3f * nd(g);
  for (auto& v : p.fixed) v = static_cast<uint8_t>(g() % kP);
  return p;
}

// ρ_p[j]: position j is kept by pattern p (format's table, the single source of the order).
bool kept(int p, int j) { return format::kPatternPairs[p][0] == j / 2 || format::kPatternPairs[p][1] == j / 2; }

// The plain fp64 forward of one group: π and Z (noise g may be null).
void plain_soft_group(const float* a, const double* g, double kappa, double tau, double* pi, double* z) {
  double u[kP], umax = -INFINITY, sum = 0.0;
  for (int p = 0; p < kP; ++p) umax = std::max(umax, u[p] = (kappa * a[p] + (g ? g[p] : 0.0)) / tau);
  for (int p = 0; p < kP; ++p) sum += (pi[p] = std::exp(u[p] - umax));
  for (int p = 0; p < kP; ++p) pi[p] /= sum;
  for (int j = 0; j < kG; ++j) {
    z[j] = 0.0;
    for (int p = 0; p < kP; ++p) z[j] += kept(p, j) ? pi[p] : 0.0;
  }
}

int plain_argmax(const float* a) {
  int best = 0;
  for (int p = 1; p < kP; ++p)
    if (a[p] > a[best]) best = p;
  return best;
}

struct Forward {
  std::vector<float> pi, W;
  std::vector<uint8_t> patterns;
};
Forward run_forward(const Params& P, SupportMode mode, double kappa, double tau, uint64_t key) {
  Forward f{std::vector<float>(P.R * kP, -1.0f), std::vector<float>(P.R * kG, -1.0f), std::vector<uint8_t>(P.R, 99)};
  GumbelSupportArgs a{.R = P.R, .mode = mode, .A = P.A.data(), .V = P.V.data(), .fixed = P.fixed.data(),
                      .kappa = kappa, .tau = tau, .key = key, .pi = f.pi.data(), .W = f.W.data(),
                      .patterns = f.patterns.data()};
  gumbel_support_forward_ref(a);
  return f;
}

}  // namespace

TEST(GumbelSupport, PatternTableIsTheFormatsTable) {
  for (int p = 0; p < kP; ++p)
    for (int i = 0; i < 2; ++i) EXPECT_EQ(gumbel::pattern_pair(p, i), format::kPatternPairs[p][i]) << "p=" << p;
  static_assert(gumbel::kGroup == format::kGroup && gumbel::kNumPatterns == format::kNumPatterns,
                "gumbel_math.h's group and pattern counts are format's");
}

TEST(GumbelSupport, NoiseIsGumbelAndCounterBased) {
  const uint64_t key = gumbel::rng_key(1, 2, 3, 4, 5);
  double sum = 0.0;
  const int n = 60000;
  for (int i = 0; i < n; ++i) {
    const float g = gumbel::rng_gumbel(key, i);
    ASSERT_TRUE(std::isfinite(g)) << "draw " << i;
    sum += g;
  }
  EXPECT_NEAR(sum / n, kEulerGamma, kGumbelMeanTol);
  // A draw depends only on (key, index); each key component changes the stream.
  EXPECT_EQ(gumbel::rng_gumbel(key, 17), gumbel::rng_gumbel(key, 17));
  EXPECT_NE(gumbel::rng_gumbel(key, 17), gumbel::rng_gumbel(key, 18));
  EXPECT_NE(key, gumbel::rng_key(1, 2, 3, 5, 5));
  EXPECT_NE(key, gumbel::rng_key(1, 2, 3, 4, 6));
  for (int i = 0; i < 1000; ++i) {
    const double u = gumbel::rng_uniform(key, i);
    ASSERT_TRUE(u > 0.0 && u < 1.0) << "uniform " << i << " = " << u;
  }
}

TEST(GumbelSupport, RelaxedForwardMatchesPlainSoftmax) {
  for (const int64_t R : {1, 7, 255, 257, 1000})
    for (const SupportMode mode : {SupportMode::kNoiseFree, SupportMode::kGumbel})
      for (const double kappa : {100.0, 400.0}) {
        const double tau = kappa > 200 ? 0.5 : 2.0;
        const Params P = random_params(R, 31 * R + static_cast<int>(mode));
        const uint64_t key = gumbel::rng_key(9, R, 2, 3, 1);
        const Forward f = run_forward(P, mode, kappa, tau, key);
        double max_pi_err = 0.0;
        int64_t spread = 0;
        for (int64_t r = 0; r < R; ++r) {
          double g[kP], pi[kP], z[kG];
          for (int p = 0; p < kP; ++p) g[p] = -std::log(-std::log(gumbel::rng_uniform(key, r * kP + p)));
          plain_soft_group(&P.A[r * kP], mode == SupportMode::kGumbel ? g : nullptr, kappa, tau, pi, z);
          for (int p = 0; p < kP; ++p) {
            const double err = std::fabs(f.pi[r * kP + p] - pi[p]);
            max_pi_err = std::max(max_pi_err, err);
            ASSERT_LE(err, kPiTol + kPiTol * pi[p]) << "R=" << R << " group " << r << " pattern " << p;
            spread += pi[p] > 0.01 && pi[p] < 0.99;
          }
          for (int j = 0; j < kG; ++j) {
            const double w = z[j] * P.V[r * kG + j];
            ASSERT_LE(std::fabs(f.W[r * kG + j] - w), 2 * kPiTol * (1.0 + std::fabs(w)) * std::fabs(P.V[r * kG + j]) + 1e-30)
                << "R=" << R << " group " << r << " position " << j;
          }
        }
        if (R >= 255) EXPECT_GT(spread, 0) << "the relaxation should not be one-hot everywhere";
      }
}

TEST(GumbelSupport, SoftmaxTermsBelowTheCutoffAreExactlyZero) {
  // κ = 100, τ = 2: a logit gap of 2 is u − umax = −100 < −60 → exactly 0; a gap of 1 (−50) is not.
  Params P = random_params(2, 1);
  std::fill(P.A.begin(), P.A.end(), 0.0f);
  P.A[0 * kP + 3] = 2.0f;  // group 0: only pattern 3 survives
  P.A[1 * kP + 4] = 1.0f;  // group 1: the others get e^-50
  const Forward f = run_forward(P, SupportMode::kNoiseFree, 100.0, 2.0, 0);
  for (int p = 0; p < kP; ++p) EXPECT_EQ(f.pi[p], p == 3 ? 1.0f : 0.0f) << "pattern " << p;
  for (int j = 0; j < kG; ++j) EXPECT_EQ(f.W[j], kept(3, j) ? P.V[j] : 0.0f) << "position " << j;
  for (int p = 0; p < kP; ++p)
    if (p != 4) EXPECT_GT(f.pi[kP + p], 0.0f) << "pattern " << p;
}

TEST(GumbelSupport, HardModesAreExactOneHotMasks) {
  for (const int64_t R : {1, 9, 257, 1000}) {
    Params P = random_params(R, 5 * R, 1.0f);
    // Ties resolve to the lowest id: make a few groups all-equal or with a tied maximum.
    for (int64_t r = 0; r < R; r += 7)
      for (int p = 0; p < kP; ++p) P.A[r * kP + p] = (r % 14 == 0) ? 0.5f : (p == 2 || p == 4 ? 3.0f : 0.0f);
    const Forward am = run_forward(P, SupportMode::kArgmax, 100.0, 2.0, 0);
    const Forward fx = run_forward(P, SupportMode::kFixed, 100.0, 2.0, 0);
    for (int64_t r = 0; r < R; ++r) {
      const int best = plain_argmax(&P.A[r * kP]);
      if (r % 7 == 0) ASSERT_EQ(best, r % 14 == 0 ? 0 : 2);
      ASSERT_EQ(am.patterns[r], best) << "R=" << R << " group " << r;
      for (int j = 0; j < kG; ++j) {
        ASSERT_EQ(am.W[r * kG + j], kept(best, j) ? P.V[r * kG + j] : 0.0f) << "argmax group " << r << " pos " << j;
        ASSERT_EQ(fx.W[r * kG + j], kept(P.fixed[r], j) ? P.V[r * kG + j] : 0.0f) << "fixed group " << r << " pos " << j;
      }
    }
    EXPECT_EQ(fx.patterns, std::vector<uint8_t>(R, 99)) << "kFixed writes no patterns";
  }
}

// With β1 = β2 = λ = 0 Lion's momentum becomes exactly the gradient (m = 0·m + 1·g) and θ moves by
// −lr·sign(g): the gradient of the fused backward against the plain fp64 one.
TEST(GumbelSupport, LionBackwardGradientMatchesPlainDefinition) {
  for (const int64_t R : {1, 33, 257, 1000})
    for (const bool relaxed : {true, false}) {
      const double kappa = 150.0, tau = 1.5, lr = 0.25;
      Params P = random_params(R, 77 * R + relaxed);
      const Forward f = run_forward(P, SupportMode::kNoiseFree, kappa, tau, 0);
      std::vector<float> A = P.A, V = P.V, mA(R * kP, 123.0f), mV(R * kG, 123.0f);
      gumbel_support_lion_ref({.R = R, .dW = P.dW.data(), .pi = relaxed ? f.pi.data() : nullptr,
                               .fixed = P.fixed.data(), .kappa = kappa, .tau = tau, .A = relaxed ? A.data() : nullptr,
                               .V = V.data(), .mom_A = relaxed ? mA.data() : nullptr, .mom_V = mV.data(), .lr_A = lr,
                               .lr_V = lr, .beta1 = 0.0, .beta2 = 0.0, .weight_decay = 0.0});
      int64_t moved = 0;
      for (int64_t r = 0; r < R; ++r) {
        double z[kG], dpi[kP], dot = 0.0, scale = 0.0;
        const float* pi = &f.pi[r * kP];
        for (int j = 0; j < kG; ++j) {
          z[j] = 0.0;
          for (int p = 0; p < kP; ++p) z[j] += relaxed ? (kept(p, j) ? pi[p] : 0.0) : (p == P.fixed[r] && kept(p, j));
        }
        for (int j = 0; j < kG; ++j) {
          const double dv = static_cast<double>(P.dW[r * kG + j]) * z[j];
          ASSERT_NEAR(mV[r * kG + j], dv, kGradRelTol * std::fabs(P.dW[r * kG + j]) + 1e-30) << "dV group " << r;
          const double want_v = P.V[r * kG + j] - (dv > 0 ? lr : dv < 0 ? -lr : 0.0);
          if (std::fabs(dv) > 1e-6 * std::fabs(P.dW[r * kG + j]) || dv == 0.0)
            ASSERT_NEAR(V[r * kG + j], want_v, 1e-6) << "V group " << r << " pos " << j;
          moved += V[r * kG + j] != P.V[r * kG + j];
        }
        if (!relaxed) continue;
        for (int p = 0; p < kP; ++p) {
          dpi[p] = 0.0;
          for (int j = 0; j < kG; ++j) dpi[p] += kept(p, j) ? static_cast<double>(P.dW[r * kG + j]) * P.V[r * kG + j] : 0.0;
          dot += pi[p] * dpi[p];
          scale = std::max(scale, std::fabs(dpi[p]));
        }
        scale *= kappa / tau;
        for (int p = 0; p < kP; ++p) {
          const double da = kappa / tau * pi[p] * (dpi[p] - dot);
          ASSERT_NEAR(mA[r * kP + p], da, kGradRelTol * scale + 1e-30) << "dA group " << r << " pattern " << p;
        }
      }
      EXPECT_GT(moved, 0);
    }
}

// The Lion element update in its fp32 order (gumbel_math.h lion_update, Chen et al. 2023 Alg. 2 with
// decoupled decay), on the gradient read out above: bitwise.
// recompute_pi: Lion recomputes the forward's kGumbel π from A (before its update) and the key — the
// same soft_group_forward on the same inputs — so the step is the stored-π step bit for bit.
TEST(GumbelSupport, LionRecomputedPiIsTheStoredPi) {
  const int64_t R = 500;
  const double kappa = 250.0, tau = 0.7;
  const uint64_t key = gumbel::rng_key(3, 9, 2, 4, 2);
  const Params P = random_params(R, 77, 0.05f);
  const Forward f = run_forward(P, SupportMode::kGumbel, kappa, tau, key);
  std::vector<float> out[2][4];
  for (const bool recompute : {false, true}) {
    std::vector<float> A = P.A, V = P.V, mA(R * kP, 1e-3f), mV(R * kG, -1e-4f);
    gumbel_support_lion_ref({.R = R, .dW = P.dW.data(), .pi = recompute ? nullptr : f.pi.data(), .kappa = kappa,
                             .tau = tau, .recompute_pi = recompute, .key = key, .A = A.data(), .V = V.data(),
                             .mom_A = mA.data(), .mom_V = mV.data(), .lr_A = 2e-3, .lr_V = 3e-4});
    out[recompute][0] = A, out[recompute][1] = V, out[recompute][2] = mA, out[recompute][3] = mV;
  }
  for (int k = 0; k < 4; ++k) EXPECT_EQ(out[1][k], out[0][k]) << "tensor " << k;
  EXPECT_NE(out[1][0], P.A);
}

TEST(GumbelSupport, LionUpdateMatchesPlainFp32Lion) {
  const int64_t R = 300;
  const double kappa = 100.0, tau = 2.0, lr_A = 3e-3, lr_V = 5e-4, b1 = 0.9, b2 = 0.95, wd = 1.0;
  Params P = random_params(R, 4242);
  const Forward f = run_forward(P, SupportMode::kGumbel, kappa, tau, gumbel::rng_key(1, 1, 2, 0, 0));
  std::mt19937_64 g(1);
  std::normal_distribution<float> nd(0.0f, 1e-3f);
  std::vector<float> mA0(R * kP), mV0(R * kG);
  for (auto& v : mA0) v = nd(g);
  for (auto& v : mV0) v = nd(g);
  mV0[5] = 0.0f;  // with a zero gradient too (a pruned position under a fixed support) sign(0) = 0
  for (const bool relaxed : {true, false}) {
    // The gradient, read out with β1 = β2 = λ = 0.
    std::vector<float> A = P.A, V = P.V, gA(R * kP), gV(R * kG);
    GumbelSupportLionArgs a{.R = R, .dW = P.dW.data(), .pi = relaxed ? f.pi.data() : nullptr, .fixed = P.fixed.data(),
                            .kappa = kappa, .tau = tau, .A = relaxed ? A.data() : nullptr, .V = V.data(),
                            .mom_A = relaxed ? gA.data() : nullptr, .mom_V = gV.data(), .lr_A = lr_A, .lr_V = lr_V,
                            .beta1 = 0.0, .beta2 = 0.0, .weight_decay = 0.0};
    gumbel_support_lion_ref(a);
    // The real step.
    A = P.A, V = P.V;
    std::vector<float> mA = mA0, mV = mV0;
    a.A = relaxed ? A.data() : nullptr, a.V = V.data(), a.mom_A = relaxed ? mA.data() : nullptr, a.mom_V = mV.data();
    a.beta1 = b1, a.beta2 = b2, a.weight_decay = wd;
    gumbel_support_lion_ref(a);
    auto plain = [&](float theta, float m, float grad, double lr, float* theta_out, float* m_out) {
      const float fb1 = static_cast<float>(b1), fb2 = static_cast<float>(b2);
      const float c = fb1 * m + (1.0f - fb1) * grad;
      const float sign = c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : 0.0f;
      *theta_out = theta - (static_cast<float>(lr) * sign + static_cast<float>(lr * wd) * theta);
      *m_out = fb2 * m + (1.0f - fb2) * grad;
    };
    for (int64_t i = 0; i < R * kG; ++i) {
      float t, m;
      plain(P.V[i], mV0[i], gV[i], lr_V, &t, &m);
      ASSERT_EQ(V[i], t) << "V " << i << " relaxed=" << relaxed;
      ASSERT_EQ(mV[i], m) << "mom_V " << i << " relaxed=" << relaxed;
    }
    if (!relaxed) {
      EXPECT_EQ(A, P.A) << "a fixed support leaves A alone";
      continue;
    }
    for (int64_t i = 0; i < R * kP; ++i) {
      float t, m;
      plain(P.A[i], mA0[i], gA[i], lr_A, &t, &m);
      ASSERT_EQ(A[i], t) << "A " << i;
      ASSERT_EQ(mA[i], m) << "mom_A " << i;
    }
  }
}

TEST(GumbelSupport, EmptyAndArgumentErrors) {
  float dummy[8] = {};
  EXPECT_NO_THROW(gumbel_support_forward_ref({.R = 0, .mode = SupportMode::kGumbel, .A = dummy, .V = dummy,
                                              .pi = dummy, .W = dummy}));
  EXPECT_NO_THROW(gumbel_support_lion_ref({.R = 0, .dW = dummy, .pi = dummy, .A = dummy, .V = dummy, .mom_A = dummy,
                                           .mom_V = dummy}));
  Params P = random_params(4, 3);
  std::vector<float> pi(4 * kP), W(4 * kG);
  const GumbelSupportArgs f{.R = 4, .mode = SupportMode::kNoiseFree, .A = P.A.data(), .V = P.V.data(),
                            .fixed = P.fixed.data(), .pi = pi.data(), .W = W.data()};
  GumbelSupportArgs b = f;
  b.R = -1;
  EXPECT_ERROR_CONTAINING(gumbel_support_forward_ref(b), "R=-1 must be >= 0");
  b = f;
  b.V = nullptr;
  EXPECT_ERROR_CONTAINING(gumbel_support_forward_ref(b), "V and W are required");
  b = f;
  b.A = nullptr;
  EXPECT_ERROR_CONTAINING(gumbel_support_forward_ref(b), "mode needs logits A");
  b = f;
  b.mode = SupportMode::kFixed;
  b.fixed = nullptr;
  EXPECT_ERROR_CONTAINING(gumbel_support_forward_ref(b), "mode needs fixed patterns");
  b = f;
  b.tau = 0.0;
  EXPECT_ERROR_CONTAINING(gumbel_support_forward_ref(b), "tau > 0 (tau=0)");
  b = f;
  b.pi = nullptr;  // π not stored (Lion recomputes it): W is the same
  gumbel_support_forward_ref(f);
  const std::vector<float> W_stored = W;
  std::fill(W.begin(), W.end(), -1.0f);
  EXPECT_NO_THROW(gumbel_support_forward_ref(b));
  EXPECT_EQ(W, W_stored);
  b = f;
  b.mode = SupportMode::kArgmax;
  b.pi = nullptr;  // hard modes need no pi
  EXPECT_NO_THROW(gumbel_support_forward_ref(b));
  std::vector<uint8_t> bad = P.fixed;
  bad[3] = 6;
  b = f;
  b.mode = SupportMode::kFixed;
  b.fixed = bad.data();
  EXPECT_ERROR_CONTAINING(gumbel_support_forward_ref(b), "pattern id 6 of group 3 is not in [0, 6)");

  std::vector<float> A = P.A, V = P.V, mA(4 * kP), mV(4 * kG);
  const GumbelSupportLionArgs l{.R = 4, .dW = P.dW.data(), .pi = pi.data(), .fixed = P.fixed.data(), .A = A.data(),
                                .V = V.data(), .mom_A = mA.data(), .mom_V = mV.data()};
  GumbelSupportLionArgs c = l;
  c.R = -2;
  EXPECT_ERROR_CONTAINING(gumbel_support_lion_ref(c), "R=-2 must be >= 0");
  c = l;
  c.mom_V = nullptr;
  EXPECT_ERROR_CONTAINING(gumbel_support_lion_ref(c), "dW, V and mom_V are required");
  c = l;
  c.mom_A = nullptr;
  EXPECT_ERROR_CONTAINING(gumbel_support_lion_ref(c), "a relaxed support needs A, mom_A and tau > 0");
  c = l;
  c.tau = -1.0;
  EXPECT_ERROR_CONTAINING(gumbel_support_lion_ref(c), "a relaxed support needs A, mom_A and tau > 0");
  c = l;
  c.pi = nullptr;
  c.fixed = nullptr;
  EXPECT_ERROR_CONTAINING(gumbel_support_lion_ref(c), "a fixed one its patterns");
  c = l;
  c.pi = nullptr;
  c.recompute_pi = true;
  c.mom_A = nullptr;
  EXPECT_ERROR_CONTAINING(gumbel_support_lion_ref(c), "a relaxed support needs A, mom_A and tau > 0");
  c = l;
  c.pi = nullptr;
  c.fixed = bad.data();
  EXPECT_ERROR_CONTAINING(gumbel_support_lion_ref(c), "pattern id 6 of group 3 is not in [0, 6)");
}

// The fused Q_w amax: max |W| over the launch folded into *amax (two launches into one: gate and up
// share a γ), and the non-finite flag — what fake_quant's amax_given then relies on.
TEST(GumbelSupport, FusedAmaxIsMaxAbsWAndNonFiniteRaisesTheFlag) {
  for (const SupportMode mode : {SupportMode::kGumbel, SupportMode::kNoiseFree, SupportMode::kArgmax, SupportMode::kFixed}) {
    const Params P = random_params(300, 21), Q = random_params(200, 22);
    std::vector<float> pi(300 * kP), W(300 * kG), pi2(200 * kP), W2(200 * kG);
    float amax = 0.0f;
    int32_t flag = 0;
    gumbel_support_forward_ref({.R = 300, .mode = mode, .A = P.A.data(), .V = P.V.data(), .fixed = P.fixed.data(),
                                .key = 9, .pi = pi.data(), .W = W.data(), .amax = &amax, .nonfinite = &flag});
    float want = 0.0f;
    for (float w : W) want = std::max(want, std::fabs(w));
    EXPECT_EQ(amax, want) << "mode " << static_cast<int>(mode);
    EXPECT_GT(amax, 0.0f);
    gumbel_support_forward_ref({.R = 200, .mode = mode, .A = Q.A.data(), .V = Q.V.data(), .fixed = Q.fixed.data(),
                                .key = 9, .pi = pi2.data(), .W = W2.data(), .amax = &amax, .nonfinite = &flag});
    for (float w : W2) want = std::max(want, std::fabs(w));
    EXPECT_EQ(amax, want) << "two launches fold into one amax, mode " << static_cast<int>(mode);
    EXPECT_EQ(flag, 0);
    // And the plain call (no amax) writes the same W.
    std::vector<float> pi3(300 * kP), W3(300 * kG);
    gumbel_support_forward_ref({.R = 300, .mode = mode, .A = P.A.data(), .V = P.V.data(), .fixed = P.fixed.data(),
                                .key = 9, .pi = pi3.data(), .W = W3.data()});
    EXPECT_EQ(W3, W);
  }
  Params P = random_params(50, 23);
  P.V[17 * kG + 3] = std::numeric_limits<float>::infinity();
  std::vector<float> pi(50 * kP), W(50 * kG);
  float amax = 0.0f;
  int32_t flag = 0;
  gumbel_support_forward_ref({.R = 50, .mode = SupportMode::kFixed, .A = P.A.data(), .V = P.V.data(),
                              .fixed = P.fixed.data(), .pi = pi.data(), .W = W.data(), .amax = &amax, .nonfinite = &flag});
  EXPECT_EQ(flag, 1);
}
