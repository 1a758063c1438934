// The GPU engine's gated attention (Qwen3-Next / Qwen3.5 full_attention layers) as its twins run it —
// the fused q|k|v projection with each q head's [query | gate] halves (QkRopeArgs::q_gate), per-head
// q/k norm and partial RoPE (QkRopeArgs::rot), the bf16 KV cache, chunked attention with the output
// gate σ(gate) (AttentionArgs::gate), o_proj over the bf16 hi + lo outputs — against the CPU mixer's
// plain-loop oracle model::attention_forward_ref on fresh random weights and inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "model/mixers/gated_attention.h"
#include "model/rope.h"
#include "ops/attention/attention.h"
#include "ops/qk_rope/qk_rope.h"

namespace {

using namespace moesq;

// The twins keep K and V in bf16 (2^-9 relative each) and the attention output as bf16 hi + lo;
// through softmax and o_proj that is ≈ 1e-3 of max |y|. The mixer has no such rounding.
constexpr double kTwinVsMixerRel = 1e-2;

std::vector<float> rnd(size_t n, std::mt19937& g, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// y [M, N] = x [M, K] · Wᵀ, fp64 sums.
std::vector<float> linear(const std::vector<float>& x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N) {
  std::vector<float> y(static_cast<size_t>(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(x[m * K + k]) * W[n * K + k];
      y[m * N + n] = static_cast<float>(acc);
    }
  return y;
}

// The engine's order for one fresh sequence of T tokens (slot 0, positions 0..T−1), gate on or off.
std::vector<float> run_twins(const model::AttentionShape& s, const model::AttentionWeights& w,
                             const std::vector<float>& x, int64_t T, bool gate) {
  const int nh = static_cast<int>(s.num_heads), nkv = static_cast<int>(s.num_kv_heads), hd = static_cast<int>(s.head_dim);
  const int64_t H = s.hidden, max_len = 128;
  std::vector<float> W = w.q_proj;  // the fused projection: q (query | gate per head), k, v rows
  W.insert(W.end(), w.k_proj.begin(), w.k_proj.end());
  W.insert(W.end(), w.v_proj.begin(), w.v_proj.end());
  const int64_t width = s.q_rows() + 2 * nkv * hd;
  const std::vector<float> qkv = linear(x, T, H, W, width);
  std::vector<float> cos, sin;
  model::rope_tables(max_len, model::rope_frequencies(s.rope), cos, sin);
  std::vector<int32_t> slot(T, 0), pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(t);
  std::vector<float> q(static_cast<size_t>(T * nh * hd));
  std::vector<uint16_t> kc(static_cast<size_t>(max_len * nkv * hd)), vc(kc.size());
  ops::QkRopeArgs r;
  r.qkv = qkv.data(), r.q_norm = w.q_norm.data(), r.k_norm = w.k_norm.data(), r.cos = cos.data(), r.sin = sin.data();
  r.tok_slot = slot.data(), r.tok_pos = pos.data(), r.q_out = q.data(), r.k_cache = kc.data(), r.v_cache = vc.data();
  r.T = T, r.nh = nh, r.nkv = nkv, r.hd = hd, r.max_len = max_len, r.eps = s.eps;
  r.rot = static_cast<int>(s.rope.rotary_dim), r.q_gate = true;
  ops::qk_rope_ref(r);
  std::vector<uint16_t> hi(static_cast<size_t>(T * nh * hd)), lo(hi.size());
  std::vector<float> partial(ops::attention_partial_floats(T, nh, hd, max_len));
  ops::AttentionArgs a;
  a.q = q.data(), a.k_cache = kc.data(), a.v_cache = vc.data(), a.tok_slot = slot.data(), a.tok_pos = pos.data();
  a.out = hi.data(), a.out_lo = lo.data(), a.T = T, a.nh = nh, a.nkv = nkv, a.hd = hd, a.max_len = max_len;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd)), a.partial = partial.data();
  if (gate) a.gate = qkv.data() + hd, a.gate_ld = width, a.gate_head_ld = 2 * hd;
  ops::attention_ref(a);
  std::vector<float> o(hi.size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = bf16_to_f32(hi[i]) + bf16_to_f32(lo[i]);
  return linear(o, T, nh * hd, w.o_proj, H);
}

TEST(GatedAttentionTwins, MatchTheMixerWithPartialRopeAndTheOutputGate) {
  std::mt19937 g(2026);
  for (const int64_t rot : {8, 16, 32}) {  // Qwen3-Next's 0.25 of 32, a half, the whole head
    model::AttentionShape s;
    s.hidden = 64, s.num_heads = 4, s.num_kv_heads = 2, s.head_dim = 32, s.output_gate = true, s.eps = 1e-6;
    s.rope.theta = 10000.0, s.rope.rotary_dim = rot;
    const int64_t H = s.hidden, hd = s.head_dim, kw = s.num_kv_heads * hd, T = 70;  // two 64-key chunks
    const float ws = 1.0f / std::sqrt(static_cast<float>(H));
    model::AttentionWeights w;
    w.q_proj = rnd(s.q_rows() * H, g, ws), w.k_proj = rnd(kw * H, g, ws), w.v_proj = rnd(kw * H, g, ws);
    w.o_proj = rnd(H * s.num_heads * hd, g, 1.0f / std::sqrt(static_cast<float>(s.num_heads * hd)));
    w.q_norm = rnd(hd, g, 0.2f), w.k_norm = rnd(hd, g, 0.2f);
    for (float& v : w.q_norm) v += 1.0f;  // the 1 + w multipliers of zero-centred norms
    for (float& v : w.k_norm) v += 1.0f;
    const std::vector<float> x = rnd(T * H, g, 1.0f);
    std::vector<float> want(T * H);
    model::attention_forward_ref(s, w, x.data(), T, want.data());
    double top = 0.0;
    for (float v : want) top = std::max(top, std::fabs(static_cast<double>(v)));
    ASSERT_GT(top, 0.0);
    auto worst = [&](const std::vector<float>& got) {
      double d = 0.0;
      for (size_t i = 0; i < got.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(got[i]) - want[i]));
      return d / top;
    };
    const double gated = worst(run_twins(s, w, x, T, /*gate=*/true));
    EXPECT_LE(gated, kTwinVsMixerRel) << "rotary dims " << rot;
    // The gate matters: without it the same twins miss by far more than the tolerance.
    EXPECT_GT(worst(run_twins(s, w, x, T, /*gate=*/false)), 10 * kTwinVsMixerRel) << "rotary dims " << rot;
  }
}

TEST(GatedAttentionTwins, BadGateAndRopeArgumentsAreRefused) {
  ops::QkRopeArgs r;
  r.nh = 4, r.nkv = 2, r.hd = 32, r.max_len = 8, r.rot = 7;
  EXPECT_THROW(ops::qk_rope_check(r), Error);
  r.rot = 40;
  EXPECT_THROW(ops::qk_rope_check(r), Error);
  r.rot = 8, r.q_gate = true, r.whole_qk_norm = true;
  EXPECT_THROW(ops::qk_rope_check(r), Error);
  ops::AttentionArgs a;
  a.nh = 4, a.nkv = 2, a.hd = 32, a.max_len = 8;
  std::vector<float> gbuf(8);
  a.gate = gbuf.data(), a.gate_ld = 64, a.gate_head_ld = 16;  // a head's gate narrower than the head
  EXPECT_THROW(ops::attention_check(a), Error);
}

}  // namespace
