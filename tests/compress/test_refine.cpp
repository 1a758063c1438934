// moesq refinement of one expert end to end (refine/loop.h): a synthetic expert whose paired 4:8 NVFP4
// optimum W* is known is recovered better than SGPTQ recovers it; reproducibility from the seed;
// the V-only ablation keeps the support; empty experts keep the SGPTQ tensors; packing agrees with
// the hard-loss curve; errors name the culprit.
//
// The synthetic expert: W* = a random paired 4:8 NVFP4 expert (random patterns, gate/up with one
// shared global scale — a fixed point of Q_w with recomputed scales). Targets Y_ref are its W4A4
// outputs, so the loss of W* is exactly 0. The "original dense" weights handed to SGPTQ are
// W* + noise (large on the pruned positions, small on the kept ones): SGPTQ reconstructs those dense
// weights layer by layer, refinement fits the expert's outputs end to end. Inputs have per-feature
// scales (an anisotropic Hessian), router weights are U(0.05, 1). All losses in the asserts are on
// FRESH rows never seen by either method, computed by this file's own plain-loop forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "compress/hessian.h"
#include "compress/refine/loop.h"
#include "compress/refine/schedule.h"
#include "compress/sgptq.h"
#include "core/error.h"
#include "core/threads.h"
#include "format/nvfp4.h"
#include "support/expect_error.h"

using namespace moesq;
using compress::ProjInit;
using compress::RefineOptions;

namespace {

// Refinement must at least halve SGPTQ's test loss on the synthetic expert (measured: 0.23–0.27×
// over seeds 1–3 at this size and budget, see docs/RESULTS.md), and match more of W*'s
// patterns than SGPTQ does.
constexpr double kMaxLossRatioVsSgptq = 0.5;

// Tuned for the small synthetic expert and ~110 steps (docs/RESULTS.md: the Table 4 rates assume
// thousands of steps; Lion moves each weight by lr per step, so few steps need a larger lr).
RefineOptions tuned_options() {
  RefineOptions o;
  o.epochs = 10;
  o.batch = 64;
  o.micro_batch = 32;
  o.lr_A = 2.5e-3;
  o.lr_V = 2.5e-4;
  o.seed = 7;
  return o;
}

// W4A4 expert forward on one row, plain loops: y = W_d·Q_a(silu(W_g·Q_a(x)) ⊙ W_u·Q_a(x)).
void forward(const float* x_in, const float* Wg, const float* Wu, const float* Wd, int64_t H,
             int64_t I, float* y) {
  std::vector<float> x(x_in, x_in + H), h(I);
  format::quantize_activation_row(x.data(), H, format::kActScaleBlock);
  for (int64_t c = 0; c < I; ++c) {
    double a = 0, b = 0;
    for (int64_t k = 0; k < H; ++k) {
      a += double(x[k]) * Wg[c * H + k];
      b += double(x[k]) * Wu[c * H + k];
    }
    h[c] = float(a / (1 + std::exp(-a)) * b);
  }
  format::quantize_activation_row(h.data(), I, format::kActScaleBlock);
  for (int64_t o = 0; o < H; ++o) {
    double s = 0;
    for (int64_t c = 0; c < I; ++c) s += double(h[c]) * Wd[o * I + c];
    y[o] = float(s);
  }
}

struct Weights {
  std::vector<float> W[3];  // gate [I,H], up [I,H], down [H,I]
};

struct Synthetic {
  int64_t H, I, n, n_test;
  Weights star, orig;
  std::vector<uint8_t> pat[3];              // W*'s patterns
  std::vector<float> X, g, Y, Xt, gt, Yt;   // calibration rows and fresh test rows
};

bool kept(uint8_t pattern, int64_t pos) { return (format::pattern_mask8(pattern) >> (pos % 8)) & 1; }

Synthetic make_synthetic(int64_t H, int64_t I, int64_t n, int64_t n_test, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.05f, 1.0f);
  Synthetic s{H, I, n, n_test, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  const int64_t N[3] = {I, I, H}, K[3] = {H, H, I};
  std::vector<float> dense[3];
  float amax[3] = {0, 0, 0};
  for (int j = 0; j < 3; ++j) {
    dense[j].resize(N[j] * K[j]);
    for (auto& w : dense[j]) w = nd(rng) / std::sqrt(float(K[j]));
    s.pat[j].resize(N[j] * K[j] / 8);
    for (auto& q : s.pat[j]) q = uint8_t(rng() % 6);
    for (int64_t i = 0; i < N[j] * K[j]; ++i)
      if (kept(s.pat[j][i / 8], i)) amax[j] = std::max(amax[j], std::fabs(dense[j][i]));
  }
  const float g_gu = format::nvfp4_tensor_scale(std::max(amax[0], amax[1]));
  const float g_d = format::nvfp4_tensor_scale(amax[2]);
  for (int j = 0; j < 3; ++j) {
    const auto t = format::sparse48_quantize(dense[j].data(), N[j], K[j], s.pat[j].data(),
                                             j == 2 ? g_d : g_gu, "W*");
    s.star.W[j].resize(N[j] * K[j]);
    format::sparse48_dequantize(t, s.star.W[j].data());
    s.orig.W[j].resize(N[j] * K[j]);
    const float sd = 1.0f / std::sqrt(float(K[j]));
    for (int64_t i = 0; i < N[j] * K[j]; ++i)
      s.orig.W[j][i] = s.star.W[j][i] + (kept(s.pat[j][i / 8], i) ? 0.1f : 0.5f) * sd * nd(rng);
  }
  std::vector<float> feat(H);
  for (auto& f : feat) f = std::exp(0.5f * nd(rng));
  auto rows = [&](int64_t m, std::vector<float>& X, std::vector<float>& g, std::vector<float>& Y) {
    X.resize(m * H);
    g.resize(m);
    Y.resize(m * H);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t k = 0; k < H; ++k) X[i * H + k] = feat[k] * nd(rng);
      g[i] = ud(rng);
      forward(&X[i * H], s.star.W[0].data(), s.star.W[1].data(), s.star.W[2].data(), H, I,
              &Y[i * H]);
    }
  };
  rows(n, s.X, s.g, s.Y);
  rows(n_test, s.Xt, s.gt, s.Yt);
  return s;
}

// Eq. 4 with p = 2 on the fresh test rows: Σ g² ‖Y − Ŷ‖² / (Σ g² · H).
double test_loss(const Synthetic& s, const Weights& w) {
  std::vector<float> y(s.H);
  double num = 0, den = 0;
  for (int64_t i = 0; i < s.n_test; ++i) {
    forward(&s.Xt[i * s.H], w.W[0].data(), w.W[1].data(), w.W[2].data(), s.H, s.I, y.data());
    double r = 0;
    for (int64_t o = 0; o < s.H; ++o) {
      const double d = double(y[o]) - s.Yt[i * s.H + o];
      r += d * d;
    }
    const double g2 = double(s.gt[i]) * s.gt[i];
    num += g2 * r;
    den += g2 * double(s.H);
  }
  return num / den;
}

Weights unpack(const format::Sparse48Tensor& g, const format::Sparse48Tensor& u,
               const format::Sparse48Tensor& d) {
  Weights w;
  const format::Sparse48Tensor* t[3] = {&g, &u, &d};
  for (int j = 0; j < 3; ++j) {
    w.W[j].resize(t[j]->N * t[j]->K);
    format::sparse48_dequantize(*t[j], w.W[j].data());
  }
  return w;
}

double pattern_match(const Synthetic& s, const format::Sparse48Tensor& g,
                     const format::Sparse48Tensor& u, const format::Sparse48Tensor& d) {
  const format::Sparse48Tensor* t[3] = {&g, &u, &d};
  int64_t ok = 0, total = 0;
  for (int j = 0; j < 3; ++j) {
    const auto q = format::sparse48_patterns(*t[j]);
    for (size_t r = 0; r < q.size(); ++r, ++total) ok += q[r] == s.pat[j][r];
  }
  return double(ok) / double(total);
}

// SGPTQ of the original dense expert (gate/up: Hessian of X, one shared γ; down: Hessian of the
// dense SwiGLU activations), as the layer-by-layer pipeline does.
struct SgptqInit {
  compress::SgptqResult r[3];
  ProjInit proj(int j) const {
    return ProjInit{r[j].dense_rounded.data(), r[j].patterns.data(), r[j].packed.global_scale,
                    &r[j].packed};
  }
};
SgptqInit run_sgptq(const Synthetic& s) {
  const int64_t H = s.H, I = s.I;
  const compress::Hessian hx = compress::accumulate_hessian(s.X.data(), s.n, H);
  std::vector<float> h(s.n * I);
  for (int64_t i = 0; i < s.n; ++i)
    for (int64_t c = 0; c < I; ++c) {
      double a = 0, b = 0;
      for (int64_t k = 0; k < H; ++k) {
        a += double(s.X[i * H + k]) * s.orig.W[0][c * H + k];
        b += double(s.X[i * H + k]) * s.orig.W[1][c * H + k];
      }
      h[i * I + c] = float(a / (1 + std::exp(-a)) * b);
    }
  const compress::Hessian hh = compress::accumulate_hessian(h.data(), s.n, I);
  float amax_gu = 0, amax_d = 0;
  for (int j = 0; j < 2; ++j)
    for (float w : s.orig.W[j]) amax_gu = std::max(amax_gu, std::fabs(w));
  for (float w : s.orig.W[2]) amax_d = std::max(amax_d, std::fabs(w));
  const float g_gu = format::nvfp4_tensor_scale(amax_gu), g_d = format::nvfp4_tensor_scale(amax_d);
  SgptqInit init;
  init.r[0] = compress::sgptq(s.orig.W[0].data(), I, H, hx, g_gu, {}, "gate_proj");
  init.r[1] = compress::sgptq(s.orig.W[1].data(), I, H, hx, g_gu, {}, "up_proj");
  init.r[2] = compress::sgptq(s.orig.W[2].data(), H, I, hh, g_d, {}, "down_proj");
  return init;
}

compress::ExpertData data_of(const Synthetic& s) {
  return compress::ExpertData{s.n, s.H, s.I, s.X.data(), s.g.data(), s.Y.data(), 3};
}

bool same_bits(const format::Sparse48Tensor& a, const format::Sparse48Tensor& b) {
  return a.N == b.N && a.K == b.K && a.values == b.values && a.meta == b.meta &&
         a.scales == b.scales && a.global_scale == b.global_scale;
}

struct Fixture {
  Synthetic s;
  SgptqInit init;
};
const Fixture& fixture() {  // built once: SGPTQ and the data are shared by the tests below
  static const Fixture f = [] {
    Fixture x{make_synthetic(128, 64, 768, 512, 1), {}};
    x.init = run_sgptq(x.s);
    return x;
  }();
  return f;
}

}  // namespace

TEST(Refine, SyntheticOptimumIsZeroLoss) {
  // Precondition of the recovery test: W* reproduces the targets exactly (a fixed point of the
  // W4A4 forward), and the noisy dense weights do not.
  const Synthetic& s = fixture().s;
  EXPECT_EQ(test_loss(s, s.star), 0.0);
  EXPECT_GT(test_loss(s, s.orig), 0.0);
}

TEST(Refine, RecoversAKnownOptimumBetterThanSgptq) {
  const Fixture& f = fixture();
  const Synthetic& s = f.s;
  const auto& r0 = f.init.r;
  const double sgptq_loss = test_loss(s, unpack(r0[0].packed, r0[1].packed, r0[2].packed));
  const double sgptq_match = pattern_match(s, r0[0].packed, r0[1].packed, r0[2].packed);
  // Magnitude patterns + RTN of the same dense weights, a second baseline.
  Weights mag_w;
  format::Sparse48Tensor mag[3];
  for (int j = 0; j < 3; ++j) {
    const int64_t N = j == 2 ? s.H : s.I, K = j == 2 ? s.I : s.H;
    const auto pat = format::magnitude_patterns(s.orig.W[j].data(), N, K);
    mag[j] = format::sparse48_quantize(s.orig.W[j].data(), N, K, pat.data());
  }
  const double mag_loss = test_loss(s, unpack(mag[0], mag[1], mag[2]));

  const auto res = compress::refine_expert(data_of(s), f.init.proj(0), f.init.proj(1),
                                           f.init.proj(2), tuned_options());
  const double refined_loss = test_loss(s, unpack(res.gate, res.up, res.down));
  const double refined_match = pattern_match(s, res.gate, res.up, res.down);
  std::printf("synthetic expert H=128 I=64 n=768: test loss sgptq %.4g magnitude %.4g refined %.4g; "
              "W* patterns matched sgptq %.3f refined %.3f; held-out init %.4g final %.4g; "
              "%ld steps, %.3f s\n",
              sgptq_loss, mag_loss, refined_loss, sgptq_match, refined_match, res.init_hard_loss,
              res.final_hard_loss, static_cast<long>(res.steps), res.seconds);
  EXPECT_FALSE(res.skipped);
  EXPECT_GT(refined_loss, 0.0);
  EXPECT_LT(refined_loss, kMaxLossRatioVsSgptq * sgptq_loss);
  EXPECT_LT(refined_loss, kMaxLossRatioVsSgptq * mag_loss);
  EXPECT_GT(refined_match, sgptq_match);
  EXPECT_LT(res.final_hard_loss, res.init_hard_loss);
  EXPECT_GT(res.pattern_change, 0.0);
  ASSERT_EQ(res.curves.hard_loss.size(), 10u);
  ASSERT_EQ(res.curves.soft_loss.size(), 10u);
  // The last hard-loss curve point is computed from Q_w(argmax ⊙ V) with recomputed scales; the
  // final loss from the packed bits. Same rows, same weights → the same number.
  EXPECT_DOUBLE_EQ(res.curves.hard_loss.back(), res.final_hard_loss);
  // Gate and up share one global scale (fused gate|up GEMM).
  EXPECT_EQ(res.gate.global_scale, res.up.global_scale);
  EXPECT_EQ(res.train_rows + res.heldout_rows, s.n);
}

TEST(Refine, ReproducibleFromTheSeed) {
  const Fixture& f = fixture();
  RefineOptions o = tuned_options();
  o.epochs = 2;
  const auto a = compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  const auto b = compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_TRUE(same_bits(a.gate, b.gate) && same_bits(a.up, b.up) && same_bits(a.down, b.down));
  EXPECT_EQ(a.curves.soft_loss, b.curves.soft_loss);
  EXPECT_EQ(a.curves.hard_loss, b.curves.hard_loss);
  o.seed += 1;
  const auto c = compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_FALSE(same_bits(a.gate, c.gate) && same_bits(a.up, c.up) && same_bits(a.down, c.down));
}

TEST(Refine, SameBitsWhateverTheThreadSchedule) {
  // Experts are refined in parallel by the pipeline: each result depends only on (seed, stream),
  // not on which thread ran it or what ran next to it.
  const Fixture& f = fixture();
  RefineOptions o = tuned_options();
  o.epochs = 2;
  const int64_t num = 4;
  std::vector<compress::RefineResult> seq(num), par(num);
  auto run = [&](int64_t i) {
    compress::ExpertData d = data_of(f.s);
    d.stream = static_cast<uint64_t>(100 + i);
    return compress::refine_expert(d, f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  };
  for (int64_t i = 0; i < num; ++i) seq[i] = run(i);
  parallel_for(num, [&](int64_t i) { par[num - 1 - i] = run(num - 1 - i); }, 2);
  for (int64_t i = 0; i < num; ++i) {
    EXPECT_TRUE(same_bits(seq[i].gate, par[i].gate) && same_bits(seq[i].up, par[i].up) &&
                same_bits(seq[i].down, par[i].down)) << "stream " << 100 + i;
    EXPECT_EQ(seq[i].curves.hard_loss, par[i].curves.hard_loss) << "stream " << 100 + i;
  }
  EXPECT_FALSE(same_bits(seq[0].gate, seq[1].gate));  // streams differ → different noise
}

TEST(Refine, VOnlyKeepsTheSupport) {
  const Fixture& f = fixture();
  RefineOptions o = tuned_options();
  o.update_A = false;
  o.epochs = 3;
  const auto r = compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_EQ(format::sparse48_patterns(r.gate), f.init.r[0].patterns);
  EXPECT_EQ(format::sparse48_patterns(r.up), f.init.r[1].patterns);
  EXPECT_EQ(format::sparse48_patterns(r.down), f.init.r[2].patterns);
  EXPECT_EQ(r.pattern_change, 0.0);
  EXPECT_LT(r.final_hard_loss, r.init_hard_loss);  // the values still improve
}

TEST(Refine, ObjectiveWeightingChangesTheResult) {
  const Fixture& f = fixture();
  RefineOptions o = tuned_options();
  o.epochs = 2;
  const auto rw = compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  o.p = 0;
  const auto un = compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_NE(rw.init_hard_loss, un.init_hard_loss);  // same rows, different weights g^p
  EXPECT_FALSE(same_bits(rw.gate, un.gate) && same_bits(rw.down, un.down));
}

TEST(Refine, EmptyExpertKeepsTheSgptqTensors) {
  const Fixture& f = fixture();
  compress::ExpertData d{0, f.s.H, f.s.I, nullptr, nullptr, nullptr, 0};
  const auto r = compress::refine_expert(d, f.init.proj(0), f.init.proj(1), f.init.proj(2), tuned_options());
  EXPECT_TRUE(r.skipped);
  EXPECT_FALSE(r.note.empty());
  EXPECT_TRUE(same_bits(r.gate, f.init.r[0].packed));
  EXPECT_TRUE(same_bits(r.up, f.init.r[1].packed));
  EXPECT_TRUE(same_bits(r.down, f.init.r[2].packed));
  // Without the packed tensors: V0/prior re-packed, patterns unchanged.
  ProjInit g = f.init.proj(0), u = f.init.proj(1), dn = f.init.proj(2);
  g.packed = u.packed = dn.packed = nullptr;
  const auto r2 = compress::refine_expert(d, g, u, dn, tuned_options());
  EXPECT_TRUE(r2.skipped);
  EXPECT_EQ(format::sparse48_patterns(r2.gate), f.init.r[0].patterns);
  EXPECT_EQ(format::sparse48_patterns(r2.down), f.init.r[2].patterns);
  EXPECT_EQ(r2.gate.global_scale, r2.up.global_scale);
}

TEST(Refine, TooFewRowsKeepsTheSgptqTensors) {
  const Fixture& f = fixture();
  RefineOptions o = tuned_options();
  o.min_rows = f.s.n + 1;
  const auto r = compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_TRUE(r.skipped);
  EXPECT_NE(r.note.find("min_rows"), std::string::npos) << r.note;
  EXPECT_TRUE(same_bits(r.down, f.init.r[2].packed));
  o.min_rows = f.s.n;  // exactly enough rows: refined
  o.epochs = 1;
  EXPECT_FALSE(compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o).skipped);
}

TEST(Refine, ZeroEpochsReturnsTheInitialSupport) {
  const Fixture& f = fixture();
  RefineOptions o = tuned_options();
  o.epochs = 0;
  const auto r = compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_EQ(r.steps, 0);
  EXPECT_EQ(r.pattern_change, 0.0);  // argmax of the prior logits is the prior
  EXPECT_EQ(format::sparse48_patterns(r.up), f.init.r[1].patterns);
  // ... and the SGPTQ solution itself, bit for bit: re-packing V0 = dec(SGPTQ) recomputes γ from
  // dec's amax and the block scales from its block maxima, which moved values (found by a new-user pass).
  EXPECT_TRUE(same_bits(r.gate, f.init.r[0].packed));
  EXPECT_TRUE(same_bits(r.up, f.init.r[1].packed));
  EXPECT_TRUE(same_bits(r.down, f.init.r[2].packed));
  EXPECT_EQ(r.final_hard_loss, r.init_hard_loss);
}

TEST(Refine, FewRowsAndRaggedBatches) {
  // 3 rows, batch 2, micro-batch 1: one row held out (floor(0.34·3) = 1), ragged last batch.
  const Synthetic s = make_synthetic(64, 32, 3, 4, 9);
  const SgptqInit init = run_sgptq(s);
  RefineOptions o = tuned_options();
  o.batch = 2;
  o.micro_batch = 1;
  o.epochs = 2;
  o.heldout_fraction = 0.34;
  const auto r = compress::refine_expert(data_of(s), init.proj(0), init.proj(1), init.proj(2), o);
  EXPECT_EQ(r.heldout_rows, 1);
  EXPECT_EQ(r.train_rows, 2);
  EXPECT_EQ(r.steps, 2);
  EXPECT_TRUE(std::isfinite(r.final_hard_loss));
  // One row: nothing can be held out, the curves use the training row and say so.
  compress::ExpertData one = data_of(s);
  one.n = 1;
  const auto r1 = compress::refine_expert(one, init.proj(0), init.proj(1), init.proj(2), o);
  EXPECT_EQ(r1.heldout_rows, 0);
  EXPECT_FALSE(r1.note.empty());
}

TEST(Refine, ScheduleRuleSetsOnlyWhatIsLeftToIt) {
  // 40 rows, 10 % held out: 36 training rows -> the rule's batch 8 (ceil(36/8) = 5 < 32, floor 8),
  // epochs from the options (2, "set"), rates from the rule for 2 · 5 = 10 steps.
  const Synthetic s = make_synthetic(64, 32, 40, 4, 11);
  const SgptqInit init = run_sgptq(s);
  RefineOptions o = tuned_options();
  o.epochs = 2;
  o.rule_batch = o.rule_lr_A = o.rule_lr_V = true;
  const auto r = compress::refine_expert(data_of(s), init.proj(0), init.proj(1), init.proj(2), o);
  const compress::RefineSchedule want = compress::refine_schedule(36, 0, 2);
  EXPECT_EQ(r.train_rows, 36);
  EXPECT_EQ(r.batch, 8);
  EXPECT_EQ(r.epochs, 2);
  EXPECT_EQ(r.steps, 10);
  EXPECT_EQ(r.steps, want.steps);
  EXPECT_DOUBLE_EQ(r.lr_A, want.lr_A);
  EXPECT_DOUBLE_EQ(r.lr_V, want.lr_V);
  EXPECT_TRUE(r.batch_from_rule && r.lr_A_from_rule && r.lr_V_from_rule);
  EXPECT_FALSE(r.epochs_from_rule);
  EXPECT_EQ(r.schedule_rows, 36);
  // Layer scope: the rule uses ExpertData::schedule_rows instead of the expert's own rows.
  o.rule_per_expert = false;
  compress::ExpertData d = data_of(s);
  d.schedule_rows = 3000;
  const auto rl = compress::refine_expert(d, init.proj(0), init.proj(1), init.proj(2), o);
  EXPECT_EQ(rl.schedule_rows, 3000);
  EXPECT_EQ(rl.batch, 64);  // ceil(3000/64) = 47 >= 32
  EXPECT_DOUBLE_EQ(rl.lr_A, compress::refine_schedule(3000, 0, 2).lr_A);
  // Per-expert scope in a layer of the large-batch regime (mean 14,746 rows: layer batch 256): the
  // expert takes the layer's batch, its steps and rates from its own 36 rows.
  o.rule_per_expert = true;
  d.schedule_rows = 14746;
  const auto rb = compress::refine_expert(d, init.proj(0), init.proj(1), init.proj(2), o);
  const compress::RefineSchedule want_b = compress::refine_schedule(36, 256, 2);
  EXPECT_EQ(rb.batch, 256);
  EXPECT_TRUE(rb.batch_from_rule);
  EXPECT_EQ(rb.schedule_rows, 36);
  EXPECT_EQ(rb.steps, 2);  // 2 epochs · ceil(36/256)
  EXPECT_DOUBLE_EQ(rb.lr_A, want_b.lr_A);
  EXPECT_DOUBLE_EQ(rb.lr_V, want_b.lr_V);
  // The rule's rates scaled (--lr-a-scale / --lr-v-scale); the steps are the rule's as before.
  o.rule_lr_A_scale = 2.0;
  o.rule_lr_V_scale = 0.5;
  const auto rs = compress::refine_expert(data_of(s), init.proj(0), init.proj(1), init.proj(2), o);
  EXPECT_EQ(rs.steps, want.steps);
  EXPECT_DOUBLE_EQ(rs.lr_A, 2.0 * want.lr_A);
  EXPECT_DOUBLE_EQ(rs.lr_V, 0.5 * want.lr_V);
  // Nothing left to the rule: the options as given (the scales apply to the rule's rates only).
  RefineOptions g = tuned_options();
  g.rule_lr_A_scale = 3.0;
  g.epochs = 1;
  const auto rg = compress::refine_expert(data_of(s), init.proj(0), init.proj(1), init.proj(2), g);
  EXPECT_EQ(rg.batch, 64);
  EXPECT_EQ(rg.lr_A, g.lr_A);
  EXPECT_FALSE(rg.batch_from_rule || rg.lr_A_from_rule);
}

// The layer-wide schedule (RefineOptions::step_sequences): steps take whole calibration sequences;
// every step with rows of this expert is an optimizer step, empty ones are skipped; reproducible; it
// refines (beats SGPTQ on fresh rows); without the rows' sequences it is an Error.
TEST(Refine, LayerWideScheduleStepsOverSequences) {
  const Fixture& f = fixture();
  compress::ExpertData d = data_of(f.s);
  std::vector<int32_t> seq(static_cast<size_t>(f.s.n));
  for (int64_t i = 0; i < f.s.n; ++i) seq[static_cast<size_t>(i)] = static_cast<int32_t>(i / 32);  // 24 sequences
  d.seq = seq.data();
  d.num_sequences = 24;
  d.layer_stream = 5;
  RefineOptions o = tuned_options();
  o.step_sequences = 6;  // 4 steps per epoch
  const auto a = compress::refine_expert(d, f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_EQ(a.steps, 4 * o.epochs);
  EXPECT_EQ(a.batch, 0);
  EXPECT_EQ(a.step_sequences, 6);
  EXPECT_LT(a.final_hard_loss, a.init_hard_loss);
  const auto& r0 = f.init.r;
  EXPECT_LT(test_loss(f.s, unpack(a.gate, a.up, a.down)), test_loss(f.s, unpack(r0[0].packed, r0[1].packed, r0[2].packed)));
  const auto b = compress::refine_expert(d, f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_TRUE(same_bits(a.gate, b.gate) && same_bits(a.up, b.up) && same_bits(a.down, b.down));
  // Half of the layer's sequences hold none of this expert's rows: those steps are skipped.
  d.num_sequences = 48;
  const auto c = compress::refine_expert(d, f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_LT(c.steps, 8 * o.epochs);
  EXPECT_GE(c.steps, 4 * o.epochs);
  // A row naming a sequence past the layer's, or no sequences at all: an Error naming the problem.
  for (int i = 0; i < 32; ++i) seq[static_cast<size_t>(i)] = 48;  // some of them are training rows
  EXPECT_THROW(compress::refine_expert(d, f.init.proj(0), f.init.proj(1), f.init.proj(2), o), Error);
  d.seq = nullptr;
  try {
    compress::refine_expert(d, f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs each row's calibration sequence"), std::string::npos) << e.what();
  }
}

TEST(Refine, ErrorsNameTheCulprit) {
  const Fixture& f = fixture();
  auto expect_error = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error, expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const auto d = data_of(f.s);
  expect_error([&] {
    RefineOptions o = tuned_options();
    o.batch = 0;
    compress::refine_expert(d, f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  }, "batch");
  expect_error([&] {
    ProjInit g = f.init.proj(0);
    g.V0 = nullptr;
    compress::refine_expert(d, g, f.init.proj(1), f.init.proj(2), tuned_options());
  }, "gate_proj");
  expect_error([&] {
    compress::ExpertData bad = d;
    bad.H = 120;  // not a multiple of 32
    compress::refine_expert(bad, f.init.proj(0), f.init.proj(1), f.init.proj(2), tuned_options());
  }, "H=120");
  expect_error([&] {
    std::vector<float> g(f.s.g);
    g[5] = -1.0f;
    compress::ExpertData bad = d;
    bad.g = g.data();
    compress::refine_expert(bad, f.init.proj(0), f.init.proj(1), f.init.proj(2), tuned_options());
  }, "g[5]");
  expect_error([&] {
    ProjInit dn = f.init.proj(2);
    dn.packed = &f.init.r[0].packed;  // [I, H] where down is [H, I]
    compress::refine_expert(d, f.init.proj(0), f.init.proj(1), dn, tuned_options());
  }, "down_proj");
}

#if defined(__SSE__)
TEST(Refine, RestoresTheFloatingPointControlWord) {
  const Fixture& f = fixture();
  const unsigned before = _mm_getcsr();
  RefineOptions o = tuned_options();
  o.epochs = 1;
  compress::refine_expert(data_of(f.s), f.init.proj(0), f.init.proj(1), f.init.proj(2), o);
  EXPECT_EQ(_mm_getcsr(), before);
}
#endif

TEST(Refine, OptionsJsonRoundTripAndErrors) {
  RefineOptions o;
  o.p = 0;
  o.update_A = false;
  o.epochs = 3;
  o.lr_A = 1e-3;
  o.seed = 12345678901ull;
  o.min_rows = 17;
  o.restore_best = true;
  const nlohmann::json j = compress::refine_options_to_json(o);
  EXPECT_EQ(j.size(), 28u);
  const RefineOptions back = compress::refine_options_from_json(j);
  EXPECT_EQ(compress::refine_options_to_json(back), j);
  EXPECT_EQ(back.seed, o.seed);
  EXPECT_FALSE(back.update_A);
  EXPECT_TRUE(back.restore_best);
  // tf32_gemm is written only when set (earlier runs' bytes stay), and round-trips.
  EXPECT_FALSE(j.contains("tf32_gemm"));
  o.tf32_gemm = true;
  EXPECT_TRUE(compress::refine_options_from_json(compress::refine_options_to_json(o)).tf32_gemm);
  EXPECT_FALSE(j.contains("tf32_backward"));
  o.tf32_backward = true;
  EXPECT_TRUE(compress::refine_options_from_json(compress::refine_options_to_json(o)).tf32_backward);
  EXPECT_FALSE(j.contains("bf16_forward"));
  o.bf16_forward = true;
  EXPECT_TRUE(compress::refine_options_from_json(compress::refine_options_to_json(o)).bf16_forward);
  // --gpu-gemm's names: bf16-forward keeps TF32 gradients; an unknown name is an Error naming the flag.
  RefineOptions m;
  compress::set_gpu_gemm(m, "bf16-forward");
  EXPECT_TRUE(m.bf16_forward && m.tf32_backward && !m.tf32_gemm);
  compress::set_gpu_gemm(m, "tf32");
  EXPECT_TRUE(!m.bf16_forward && !m.tf32_backward && m.tf32_gemm);
  compress::set_gpu_gemm(m, "fp32");
  EXPECT_TRUE(!m.bf16_forward && !m.tf32_backward && !m.tf32_gemm);
  EXPECT_ERROR_CONTAINING(compress::set_gpu_gemm(m, "bf16", "--gemm"), "--gemm: 'bf16' is not one of");
  // Missing keys keep their defaults.
  EXPECT_EQ(compress::refine_options_from_json({{"epochs", 4}}).lr_V, RefineOptions{}.lr_V);
  EXPECT_EQ(compress::refine_options_from_json(nullptr).epochs, RefineOptions{}.epochs);
  EXPECT_THROW(compress::refine_options_from_json({{"lr_a", 1e-3}}), Error);     // typo
  EXPECT_THROW(compress::refine_options_from_json({{"epochs", "ten"}}), Error);  // wrong type
}
