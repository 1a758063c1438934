// The family mixers, routers and experts on fresh random inputs (fixed seeds, never zeros), fast
// path vs plain-loop twin, over awkward shapes: Gated DeltaNet (incl. state continuation and
// Qwen3-Next's fused layout), attention (gate, sinks, window, biases, partial RoPE, KV-cache
// decode), YaRN frequencies against an independent double-precision formula, the softmax router,
// gpt-oss's top-k-softmax router and clamped, biased SwiGLU expert (model::swiglu_forward with an
// ExpertVariant, against its twin and a double-precision definition) with its fused-tensor unpacking.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/decoder.h"
#include "model/fused_experts.h"
#include "model/mixers/gated_attention.h"
#include "model/mixers/gated_deltanet.h"
#include "model/tensor_math.h"
#include "model/rope.h"
#include "model/router.h"
#include "support/family_reference.h"

namespace {

using namespace moesq::model;
using moesq::test::max_abs;
using moesq::test::max_abs_diff;

// Fast vs twin: only GEMM summation order differs (values O(1), K <= 64): a few fp32 ulps.
constexpr double kTwinAtol = 1e-5;
// State continuation vs one call: the same recurrence; projections differ by GEMM M only.
constexpr double kStateAtol = 1e-5;
// YaRN inv_freq in fp32 vs a double-precision evaluation of the same formula (relative).
constexpr double kYarnRtol = 1e-6;

std::vector<float> rnd(size_t n, std::mt19937& g, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

GdnWeights random_gdn(const GdnShape& s, std::mt19937& g) {
  const int64_t H = s.hidden, C = s.conv_dim(), Vd = s.value_dim(), nv = s.num_v_heads;
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  GdnWeights w;
  w.in_proj_qkv = rnd(C * H, g, ws);
  w.in_proj_z = rnd(Vd * H, g, ws);
  w.in_proj_b = rnd(nv * H, g, ws);
  w.in_proj_a = rnd(nv * H, g, ws);
  w.conv1d = rnd(C * s.conv_kernel, g, 0.5f);
  w.dt_bias = rnd(nv, g, 0.5f);
  w.A_log = rnd(nv, g, 0.5f);
  w.norm = rnd(s.head_v_dim, g, 0.3f);
  for (float& v : w.norm) v += 1.0f;
  w.out_proj = rnd(H * Vd, g, 1.0f / std::sqrt(static_cast<float>(Vd)));
  return w;
}

struct GdnCase {
  int64_t nk, nv, dk, dv, kc, T;
};

TEST(GatedDeltaNet, FastMatchesRefAndStateContinues) {
  const GdnCase cases[] = {{2, 4, 16, 8, 4, 1}, {2, 4, 16, 8, 4, 2}, {1, 1, 8, 8, 4, 3}, {2, 2, 8, 16, 1, 17},
                           {3, 6, 8, 8, 3, 33}, {2, 4, 32, 32, 4, 64}};
  std::mt19937 g(1234);
  for (const GdnCase& c : cases) {
    GdnShape s;
    s.hidden = 48;
    s.num_k_heads = c.nk;
    s.num_v_heads = c.nv;
    s.head_k_dim = c.dk;
    s.head_v_dim = c.dv;
    s.conv_kernel = c.kc;
    const GdnWeights w = random_gdn(s, g);
    const std::vector<float> x = rnd(c.T * s.hidden, g);
    std::vector<float> y(c.T * s.hidden), y_ref(c.T * s.hidden);
    gated_deltanet_forward(s, w, x.data(), c.T, y.data());
    gated_deltanet_forward_ref(s, w, x.data(), c.T, y_ref.data());
    EXPECT_LE(max_abs_diff(y.data(), y_ref.data(), y.size()), kTwinAtol)
        << "nk " << c.nk << " nv " << c.nv << " dk " << c.dk << " dv " << c.dv << " Kc " << c.kc << " T " << c.T;
    EXPECT_GT(max_abs(y), 1e-3);
    // The same sequence in pieces through one state: 1 token, then the rest in uneven chunks.
    GdnState st = gdn_initial_state(s);
    std::vector<float> y_pieces(c.T * s.hidden);
    for (int64_t t0 = 0, step = 1; t0 < c.T; t0 += step, step = step % 3 + 1) {
      const int64_t n = std::min(step, c.T - t0);
      gated_deltanet_forward(s, w, &x[t0 * s.hidden], n, &y_pieces[t0 * s.hidden], &st);
    }
    EXPECT_EQ(st.tokens, c.T);
    EXPECT_LE(max_abs_diff(y_pieces.data(), y.data(), y.size()), kStateAtol) << "state continuation, T " << c.T;
  }
}

// Qwen3-Next's fused rows land where the separate Qwen3.5 layout has them: every weight row is
// filled with its own row id (integers: exact), and the unfused tensors must hold the ids the
// per-key-head grouping implies.
TEST(GatedDeltaNet, UnfuseQkvzBaLayout) {
  GdnShape s;
  s.hidden = 2;
  s.num_k_heads = 2;
  s.num_v_heads = 6;  // r = 3 value heads per key head
  s.head_k_dim = 2;
  s.head_v_dim = 2;
  const int64_t H = 2, dk = 2, dv = 2, r = 3, group = 2 * dk + 2 * r * dv;
  std::vector<float> qkvz(2 * group * H), ba(2 * 6 * H);
  for (size_t i = 0; i < qkvz.size(); ++i) qkvz[i] = static_cast<float>(i / H);
  for (size_t i = 0; i < ba.size(); ++i) ba[i] = static_cast<float>(1000 + i / H);
  GdnWeights w;
  unfuse_qkvz_ba(s, qkvz, ba, w);
  const int64_t Kd = 4;
  for (int64_t gk = 0; gk < 2; ++gk) {
    for (int64_t i = 0; i < dk; ++i) {
      EXPECT_EQ(w.in_proj_qkv[(gk * dk + i) * H], gk * group + i) << "q row";
      EXPECT_EQ(w.in_proj_qkv[(Kd + gk * dk + i) * H], gk * group + dk + i) << "k row";
    }
    for (int64_t i = 0; i < r * dv; ++i) {
      EXPECT_EQ(w.in_proj_qkv[(2 * Kd + gk * r * dv + i) * H + 1], gk * group + 2 * dk + i) << "v row";
      EXPECT_EQ(w.in_proj_z[(gk * r * dv + i) * H], gk * group + 2 * dk + r * dv + i) << "z row";
    }
    for (int64_t i = 0; i < r; ++i) {
      EXPECT_EQ(w.in_proj_b[(gk * r + i) * H], 1000 + gk * 2 * r + i) << "b row";
      EXPECT_EQ(w.in_proj_a[(gk * r + i) * H], 1000 + gk * 2 * r + r + i) << "a row";
    }
  }
}

AttentionWeights random_attention(const AttentionShape& s, bool bias, bool qk_norm, bool sinks, std::mt19937& g) {
  const int64_t H = s.hidden, kw = s.num_kv_heads * s.head_dim, ow = s.num_heads * s.head_dim;
  const float ws = 1.0f / std::sqrt(static_cast<float>(H));
  AttentionWeights w;
  w.q_proj = rnd(s.q_rows() * H, g, ws);
  w.k_proj = rnd(kw * H, g, ws);
  w.v_proj = rnd(kw * H, g, ws);
  w.o_proj = rnd(H * ow, g, 1.0f / std::sqrt(static_cast<float>(ow)));
  if (bias) {
    w.q_bias = rnd(s.q_rows(), g, 0.1f);
    w.k_bias = rnd(kw, g, 0.1f);
    w.v_bias = rnd(kw, g, 0.1f);
    w.o_bias = rnd(H, g, 0.1f);
  }
  if (qk_norm) {
    w.q_norm = rnd(s.head_dim, g, 0.2f);
    w.k_norm = rnd(s.head_dim, g, 0.2f);
    for (float& v : w.q_norm) v += 1.0f;
    for (float& v : w.k_norm) v += 1.0f;
  }
  if (sinks) w.sinks = rnd(s.num_heads, g, 1.0f);
  return w;
}

TEST(AttentionMixer, FastMatchesRefOverVariants) {
  std::mt19937 g(99);
  for (int variant = 0; variant < 4; ++variant)
    for (int64_t T : {1, 2, 3, 17, 70}) {
      AttentionShape s;
      s.hidden = 40;
      s.num_heads = 4;
      s.num_kv_heads = variant == 2 ? 4 : 2;
      s.head_dim = 16;
      s.output_gate = variant == 0 || variant == 3;
      s.window = variant == 1 || variant == 3 ? 16 : 0;
      s.rope.rotary_dim = variant == 0 ? 4 : 16;
      if (variant == 1) {
        s.rope.type = moesq::io::HybridRopeType::Yarn;
        s.rope.factor = 8.0;
        s.rope.original_max_position_embeddings = 64;
        s.rope.attention_factor = 0.1 * std::log(8.0) + 1.0;
      }
      const AttentionWeights w = random_attention(s, variant != 0, variant != 1, variant == 1 || variant == 3, g);
      const std::vector<float> x = rnd(T * s.hidden, g);
      std::vector<float> y(T * s.hidden), y_ref(T * s.hidden), y_dec(T * s.hidden);
      attention_forward(s, w, x.data(), T, y.data());
      attention_forward_ref(s, w, x.data(), T, y_ref.data());
      EXPECT_LE(max_abs_diff(y.data(), y_ref.data(), y.size()), kTwinAtol) << "variant " << variant << " T " << T;
      EXPECT_GT(max_abs(y), 1e-3);
      KvCache cache;  // token by token through the cache
      for (int64_t t = 0; t < T; ++t) attention_forward(s, w, &x[t * s.hidden], 1, &y_dec[t * s.hidden], &cache);
      EXPECT_EQ(cache.len, T);
      EXPECT_LE(max_abs_diff(y_dec.data(), y.data(), y.size()), kStateAtol) << "decode, variant " << variant << " T " << T;
    }
}

// A window covering the whole sequence is full attention; a shorter one changes exactly the
// positions whose causal prefix is longer than the window.
TEST(AttentionMixer, SlidingWindowBoundary) {
  std::mt19937 g(7);
  AttentionShape s;
  s.hidden = 32;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.head_dim = 16;
  s.rope.rotary_dim = 16;
  const AttentionWeights w = random_attention(s, true, false, true, g);
  const int64_t T = 40, W = 8;
  const std::vector<float> x = rnd(T * s.hidden, g);
  std::vector<float> full(T * s.hidden), wide(T * s.hidden), narrow(T * s.hidden);
  attention_forward_ref(s, w, x.data(), T, full.data());
  s.window = T;
  attention_forward_ref(s, w, x.data(), T, wide.data());
  EXPECT_EQ(max_abs_diff(wide.data(), full.data(), full.size()), 0.0);
  s.window = W;
  attention_forward(s, w, x.data(), T, narrow.data());
  for (int64_t t = 0; t < T; ++t) {
    const double d = max_abs_diff(&narrow[t * s.hidden], &full[t * s.hidden], s.hidden);
    if (t < W) EXPECT_LE(d, kTwinAtol) << "position " << t << " sees its whole prefix";
    else EXPECT_GT(d, 1e-4) << "position " << t << " must lose keys older than the window";
  }
}

// YaRN frequencies vs the formula evaluated in double (Peng et al. 2023, Eq. 19–23 as transformers
// implements it), with and without truncation of the correction range.
TEST(Rope, YarnInverseFrequencies) {
  for (bool truncate : {false, true}) {
    moesq::io::HybridRopeSpec r;
    r.type = moesq::io::HybridRopeType::Yarn;
    r.theta = 150000.0;
    r.rotary_dim = 32;
    r.factor = 32.0;
    r.original_max_position_embeddings = 4096;
    r.truncate = truncate;
    const std::vector<float> inv = rope_frequencies(r).inv_freq;
    const double d = 32, pi = std::acos(-1.0);
    auto corr = [&](double rot) { return d * std::log(4096.0 / (rot * 2 * pi)) / (2 * std::log(r.theta)); };
    double lo = corr(32.0), hi = corr(1.0);
    if (truncate) {
      lo = std::floor(lo);
      hi = std::ceil(hi);
    }
    lo = std::max(lo, 0.0);
    hi = std::min(hi, d - 1);
    int64_t interpolated = 0;
    for (int64_t i = 0; i < 16; ++i) {
      const double base = std::pow(r.theta, 2.0 * i / d);
      const double ramp = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
      const double want = (1.0 / (r.factor * base)) * ramp + (1.0 / base) * (1.0 - ramp);
      EXPECT_NEAR(inv[i], want, kYarnRtol * want) << "dim pair " << i << " truncate " << truncate;
      interpolated += ramp == 1.0;
    }
    EXPECT_GT(interpolated, 0);  // some low frequencies are fully interpolated
    EXPECT_EQ(inv[0], 1.0f);     // the highest frequency is never scaled
  }
}

TEST(Routers, TwinsAndSelectionRules) {
  std::mt19937 g(5);
  const int64_t E = 12, H = 24, n = 37;
  const std::vector<float> W = rnd(E * H, g), b = rnd(E, g), x = rnd(n * H, g);
  for (int64_t k : {1, 2, 5, 12}) {
    // The softmax router (renormalised top-k, as Qwen3-Next / Qwen3.5 route) on the logits of the BLAS
    // linear and of its plain-loop twin: the same experts.
    RouterSpec soft;
    soft.num_experts = E;
    soft.top_k = k;
    std::vector<float> za(n * E), za_ref(n * E);
    linear(x.data(), n, H, W.data(), E, za.data());
    linear_ref(x.data(), n, H, W.data(), E, za_ref.data());
    const Routes a = select_routes(soft, za, n, nullptr);
    const Routes a_ref = select_routes(soft, za_ref, n, nullptr);
    EXPECT_LE(max_abs_diff(a.logits.data(), a_ref.logits.data(), a.logits.size()), kTwinAtol);
    EXPECT_EQ(a.expert, a_ref.expert) << "k " << k;
    // gpt-oss's router (model/router.h TopkSoftmax) on biased logits z = x Wᵀ + b, against its
    // definition in double: the k largest logits, weights = softmax over them.
    std::vector<float> z(n * E);
    linear_ref(x.data(), n, H, W.data(), E, z.data());
    add_bias_rows(z.data(), n, E, b);
    RouterSpec rs;
    rs.num_experts = E;
    rs.top_k = k;
    rs.scoring = moesq::io::RouterScoring::TopkSoftmax;
    const Routes c = select_routes(rs, z, n, nullptr);
    EXPECT_EQ(c.logits, z);
    for (int64_t t = 0; t < n; ++t) {
      double sa = 0, sc = 0, den = 0;
      const float* zt = &z[t * E];
      const float zmax = *std::max_element(zt, zt + E);
      for (int64_t j = 0; j < k; ++j) den += std::exp(static_cast<double>(zt[c.expert[t * k + j]]) - zmax);
      for (int64_t j = 0; j < k; ++j) {
        sa += a.weight[t * k + j];
        sc += c.weight[t * k + j];
        const int32_t e = c.expert[t * k + j];
        EXPECT_NEAR(c.weight[t * k + j], std::exp(static_cast<double>(zt[e]) - zmax) / den, 1e-6);
        if (j > 0) EXPECT_GE(zt[c.expert[t * k + j - 1]], zt[e]);
      }
      // No expert outside the top-k has a larger logit than the smallest chosen one.
      const float kth = zt[c.expert[t * k + k - 1]];
      for (int64_t e = 0; e < E; ++e)
        if (std::find(&c.expert[t * k], &c.expert[t * k] + k, e) == &c.expert[t * k] + k) EXPECT_LE(zt[e], kth);
      EXPECT_NEAR(sa, 1.0, 1e-6);
      EXPECT_NEAR(sc, 1.0, 1e-6);
    }
  }
  // Integer case: with W = 0 the bias alone decides; equal logits go to the lower id.
  std::vector<float> bias(E, 0.0f);
  bias[7] = 3.0f;
  bias[2] = 1.0f;
  bias[9] = 1.0f;
  RouterSpec rs;
  rs.num_experts = E;
  rs.top_k = 3;
  rs.scoring = moesq::io::RouterScoring::TopkSoftmax;
  std::vector<float> z1(E, 0.0f);
  add_bias_rows(z1.data(), 1, E, bias);
  const Routes t = select_routes(rs, z1, 1, nullptr);
  EXPECT_EQ(t.expert, (std::vector<int32_t>{7, 2, 9}));
  EXPECT_NEAR(t.weight[0], std::exp(3.0) / (std::exp(3.0) + 2 * std::exp(1.0)), 1e-6);
}

// gpt-oss's expert in double from its definition (transformers GptOssExperts) on Linear-layout weights.
std::vector<double> gpt_oss_expert_def(const ExpertWeights& w, int64_t H, int64_t I, const float* x, int64_t n,
                                       double alpha, double limit) {
  std::vector<double> y(n * H), h(I);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      double gg = w.gate_bias[i], uu = w.up_bias[i];
      for (int64_t c = 0; c < H; ++c) {
        gg += static_cast<double>(x[t * H + c]) * w.gate[i * H + c];
        uu += static_cast<double>(x[t * H + c]) * w.up[i * H + c];
      }
      gg = std::min(gg, limit);
      uu = std::clamp(uu, -limit, limit);
      h[i] = (uu + 1.0) * gg / (1.0 + std::exp(-alpha * gg));
    }
    for (int64_t c = 0; c < H; ++c) {
      double acc = w.down_bias[c];
      for (int64_t i = 0; i < I; ++i) acc += h[i] * w.down[c * I + i];
      y[t * H + c] = acc;
    }
  }
  return y;
}

TEST(Experts, ClampedSwigluTwinsAndFusedUnpack) {
  std::mt19937 g(11);
  const int64_t E = 3, H = 16, I = 8;
  // Large scale so that both clamps (gate ≤ 7, |up| ≤ 7) are active on some elements.
  const std::vector<float> gate_up = rnd(E * H * 2 * I, g, 1.5f), gub = rnd(E * 2 * I, g, 1.0f);
  const std::vector<float> down = rnd(E * I * H, g, 0.3f), db = rnd(E * H, g, 0.2f);
  moesq::io::ModelSpec spec;
  spec.clamped_swiglu = true;
  spec.expert_bias = true;
  for (int64_t e = 0; e < E; ++e) {
    ExpertWeights w;
    unpack_fused_gate_up(gate_up.data(), gub.data(), E, H, I, e, w);
    unpack_fused_down(down.data(), db.data(), E, H, I, e, w);
    for (int64_t c = 0; c < H; ++c)
      for (int64_t i = 0; i < I; ++i) {
        ASSERT_EQ(w.gate[i * H + c], gate_up[(e * H + c) * 2 * I + 2 * i]);
        ASSERT_EQ(w.up[i * H + c], gate_up[(e * H + c) * 2 * I + 2 * i + 1]);
        ASSERT_EQ(w.down[c * I + i], down[(e * I + i) * H + c]);
      }
    for (int64_t i = 0; i < I; ++i) {
      ASSERT_EQ(w.gate_bias[i], gub[e * 2 * I + 2 * i]);
      ASSERT_EQ(w.up_bias[i], gub[e * 2 * I + 2 * i + 1]);
    }
    for (int64_t c = 0; c < H; ++c) ASSERT_EQ(w.down_bias[c], db[e * H + c]);
    const ExpertVariant v = expert_variant(spec, w);
    for (int64_t n : {1, 3, 9}) {
      const std::vector<float> x = rnd(n * H, g, 2.0f);
      const auto run = [&](bool ref, const ExpertVariant& var) {
        return (ref ? swiglu_forward_ref : swiglu_forward)(w.gate.data(), w.up.data(), w.down.data(), H, I, x.data(),
                                                           n, 0, nullptr, var);
      };
      const std::vector<float> y = run(false, v), y_ref = run(true, v);
      const std::vector<double> y_def = gpt_oss_expert_def(w, H, I, x.data(), n, 1.702, 7.0);
      // Outputs here reach O(10) (clamps active): the twin budget scales with the output magnitude.
      const double scale = std::max(1.0, max_abs(y_ref));
      EXPECT_LE(max_abs_diff(y.data(), y_ref.data(), y.size()), kTwinAtol * scale) << "expert " << e << " n " << n;
      double def_err = 0;
      for (size_t i = 0; i < y.size(); ++i) def_err = std::max(def_err, std::fabs(y_ref[i] - y_def[i]));
      EXPECT_LE(def_err, kTwinAtol * scale) << "expert " << e << " n " << n << ": not GptOssExperts' expert";
      EXPECT_GT(max_abs(y), 1e-3);
      ExpertVariant open = v;
      open.limit = 1e9f;
      const std::vector<float> y_open = run(true, open);
      if (n == 9) EXPECT_GT(max_abs_diff(y_open.data(), y_ref.data(), y.size()), 1e-3) << "the clamp must bite";
      ExpertVariant plain = v;
      plain.clamped = false;
      plain.gate_bias = plain.up_bias = plain.down_bias = nullptr;
      EXPECT_GT(max_abs_diff(run(false, plain).data(), y.data(), y.size()), 1e-3) << "the variant must matter";
    }
  }
}

}  // namespace
