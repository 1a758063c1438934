// The GPU routing input's ops (compress/attention_cuda.cu), through their CPU twins, against the CPU
// stage they replace (DecoderModel::attention_block + moe_input): the chain
//   rmsnorm_ref (fp32 out) → linear q|k|v → qk_rope_ref (fp32 k/v rows) → causal_attention_f32_ref →
//   linear o_proj, h += o → rmsnorm_ref (post norm)
// over sequences packed row after row reproduces the per-sequence CPU forward (full causal and a
// sliding window); causal_attention_f32_ref equals a direct transcription of the definition on an
// awkward GQA shape (and with values narrower than keys, head dims not a multiple of 32); the MLA chain
// (compress/mla_cuda.cu) through its twins reproduces the DeepSeek-V3 fixture's MlaMixer; the ops' new fp32 outputs equal their bf16 paths before the rounding; the twin's
// errors name the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/half.h"
#include "compress/pipeline.h"
#include "model/decoder.h"
#include "model/rope.h"
#include "model/tensor_math.h"
#include "io/checkpoint.h"
#include "model/mixers/mla_mixer.h"
#include "ops/causal_attention_f32/causal_attention_f32.h"
#include "ops/mla_f32/mla_f32.h"
#include "ops/qk_rope/qk_rope.h"
#include "ops/rmsnorm/rmsnorm.h"
#include "support/expect_error.h"

namespace {

using namespace moesq;

// The chain runs the CPU forward's expressions in the same order except the RMSNorms' fp64 sums (a
// 256-way tree vs a running sum: the scale may differ in its last bit) and the head norm's (a 32-lane
// butterfly): relative Frobenius error of h and X.
constexpr double kChainRelFro = 1e-6;

std::vector<float> random_vec(size_t n, uint64_t seed, float sd, float mean = 0.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(g);
  return x;
}

double rel_fro(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

io::ModelSpec attn_spec() {
  io::ModelSpec s;
  s.model_type = "qwen3_moe";
  s.vocab_size = 16;
  s.hidden_size = 96;
  s.intermediate_size = 64;
  s.moe_intermediate_size = 32;
  s.num_layers = 1;
  s.num_heads = 6;
  s.num_kv_heads = 2;
  s.head_dim = 64;
  s.num_experts = 4;
  s.top_k = 2;
  s.rms_norm_eps = 1e-6;
  s.rope_theta = 10000.0;
  return s;
}

void randomize_attention(model::DecoderModel& m, uint64_t seed) {
  model::LayerWeights& L = m.layer(0);
  const float ws = 1.0f / std::sqrt(static_cast<float>(m.spec().hidden_size));
  L.input_norm = random_vec(L.input_norm.size(), seed + 1, 0.1f, 1.0f);
  L.post_norm = random_vec(L.post_norm.size(), seed + 2, 0.1f, 1.0f);
  L.q_norm = random_vec(L.q_norm.size(), seed + 3, 0.1f, 1.0f);
  L.k_norm = random_vec(L.k_norm.size(), seed + 4, 0.1f, 1.0f);
  L.q_proj = random_vec(L.q_proj.size(), seed + 5, ws);
  L.k_proj = random_vec(L.k_proj.size(), seed + 6, ws);
  L.v_proj = random_vec(L.v_proj.size(), seed + 7, ws);
  L.o_proj = random_vec(L.o_proj.size(), seed + 8, ws);
}

// The chain of twins over packed sequences (the GPU path's order, compress/attention_cuda.cu).
std::vector<float> chain(const io::ModelSpec& s, const model::LayerWeights& L, std::vector<float>& h,
                         const std::vector<int64_t>& offset) {
  const int64_t H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  const int64_t qw = nh * hd, kw = nkv * hd, n = offset.back();
  int64_t max_T = 1;
  std::vector<int32_t> pos(n);
  std::vector<int64_t> start(n);
  for (size_t i = 0; i + 1 < offset.size(); ++i) {
    max_T = std::max(max_T, offset[i + 1] - offset[i]);
    for (int64_t r = offset[i]; r < offset[i + 1]; ++r) {
      pos[r] = static_cast<int32_t>(r - offset[i]);
      start[r] = offset[i];
    }
  }
  std::vector<float> xn(n * H), wqkv;
  ops::rmsnorm_ref({.x = h.data(), .w = L.input_norm.data(), .y = nullptr, .y_lo = nullptr, .y_f32 = xn.data(),
                    .n = n, .D = H, .eps = s.rms_norm_eps});
  wqkv.insert(wqkv.end(), L.q_proj.begin(), L.q_proj.end());
  wqkv.insert(wqkv.end(), L.k_proj.begin(), L.k_proj.end());
  wqkv.insert(wqkv.end(), L.v_proj.begin(), L.v_proj.end());
  std::vector<float> qkv(n * (qw + 2 * kw)), q(n * qw), k(n * kw), v(n * kw), attn(n * qw), o(n * H), X(n * H);
  model::linear_ref(xn.data(), n, H, wqkv.data(), qw + 2 * kw, qkv.data());
  std::vector<float> cos_t, sin_t;
  model::rope_tables(max_T, hd, s.rope_theta, cos_t, sin_t, false);
  ops::QkRopeArgs r;
  r.qkv = qkv.data();
  r.q_norm = L.q_norm.data();
  r.k_norm = L.k_norm.data();
  r.cos = cos_t.data();
  r.sin = sin_t.data();
  r.tok_pos = pos.data();
  r.q_out = q.data();
  r.k_out = k.data();
  r.v_out = v.data();
  r.T = n;
  r.nh = static_cast<int>(nh);
  r.nkv = static_cast<int>(nkv);
  r.hd = static_cast<int>(hd);
  r.max_len = max_T;
  r.eps = s.rms_norm_eps;
  ops::qk_rope_ref(r);
  ops::causal_attention_f32_ref({.q = q.data(), .k = k.data(), .v = v.data(), .row_start = start.data(),
                                 .out = attn.data(), .n = n, .nh = static_cast<int>(nh), .nkv = static_cast<int>(nkv),
                                 .hd = static_cast<int>(hd), .window = L.attention_window,
                                 .scale = 1.0f / std::sqrt(static_cast<float>(hd))});
  model::linear_ref(attn.data(), n, qw, L.o_proj.data(), H, o.data());
  for (int64_t i = 0; i < n * H; ++i) h[i] += o[i];
  ops::rmsnorm_ref({.x = h.data(), .w = L.post_norm.data(), .y = nullptr, .y_lo = nullptr, .y_f32 = X.data(), .n = n,
                    .D = H, .eps = s.rms_norm_eps});
  return X;
}

}  // namespace

TEST(LayerGpuTwins, ChainOfTwinsReproducesTheCpuAttentionBlock) {
  for (const int64_t window : {0, 5}) {
    model::DecoderModel m(attn_spec());
    randomize_attention(m, 40 + window);
    m.layer(0).attention_window = window;
    ASSERT_EQ(compress::gpu_attention_refusal(m.spec(), m.layer(0)), "");
    const int64_t H = m.spec().hidden_size;
    const std::vector<int64_t> lens = {1, 17, 9, 33};
    std::vector<int64_t> offset = {0};
    for (int64_t T : lens) offset.push_back(offset.back() + T);
    std::vector<float> h = random_vec(offset.back() * H, 9, 1.0f);
    std::vector<float> h_cpu = h, X_cpu;
    for (size_t i = 0; i < lens.size(); ++i) {
      std::vector<float> hs(h.begin() + offset[i] * H, h.begin() + offset[i + 1] * H);
      m.attention_block(0, hs, lens[i], {});
      std::copy(hs.begin(), hs.end(), h_cpu.begin() + offset[i] * H);
      const std::vector<float> x = m.moe_input(0, hs, lens[i]);
      X_cpu.insert(X_cpu.end(), x.begin(), x.end());
    }
    const std::vector<float> X = chain(m.spec(), m.layer(0), h, offset);
    EXPECT_LE(rel_fro(h, h_cpu), kChainRelFro) << "window " << window;
    EXPECT_LE(rel_fro(X, X_cpu), kChainRelFro) << "window " << window;
    // A chain that ignored the sequence boundaries would attend across them: it must not match.
    std::vector<float> h2 = random_vec(offset.back() * H, 9, 1.0f);
    const std::vector<int64_t> one = {0, offset.back()};
    chain(m.spec(), m.layer(0), h2, one);
    EXPECT_GT(rel_fro(h2, h_cpu), 1e-3) << "window " << window;
  }
}

TEST(LayerGpuTwins, CausalAttentionTwinIsTheDefinition) {
  const int nh = 4, nkv = 2, hd = 32;
  const int64_t n = 11, qw = nh * hd, kw = nkv * hd;
  const std::vector<int64_t> start = {0, 0, 0, 3, 3, 3, 3, 3, 8, 8, 8};
  const auto q = random_vec(n * qw, 1, 1.0f), k = random_vec(n * kw, 2, 1.0f), v = random_vec(n * kw, 3, 1.0f);
  for (const int64_t window : {0, 2}) {
    std::vector<float> out(n * qw, NAN);
    const float scale = 0.3f;
    ops::causal_attention_f32_ref({.q = q.data(), .k = k.data(), .v = v.data(), .row_start = start.data(),
                                   .out = out.data(), .n = n, .nh = nh, .nkv = nkv, .hd = hd, .window = window,
                                   .scale = scale});
    for (int64_t t = 0; t < n; ++t)
      for (int i = 0; i < nh; ++i) {
        const int g = i / 2;
        const int64_t lo = window > 0 ? std::max(start[t], t - window + 1) : start[t];
        std::vector<double> w;
        double mx = -1e300, sum = 0;
        for (int64_t j = lo; j <= t; ++j) {
          double d = 0;
          for (int c = 0; c < hd; ++c) d += static_cast<double>(q[t * qw + i * hd + c]) * k[j * kw + g * hd + c];
          w.push_back(d * scale);
          mx = std::max(mx, w.back());
        }
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int c = 0; c < hd; ++c) {
          double o = 0;
          for (int64_t j = lo; j <= t; ++j) o += w[j - lo] / sum * v[j * kw + g * hd + c];
          EXPECT_NEAR(out[t * qw + i * hd + c], o, 1e-5) << "t " << t << " head " << i << " window " << window;
        }
      }
  }
  std::vector<float> out(n * qw);
  std::vector<int64_t> bad = start;
  bad[5] = 4;  // not the first row of its sequence
  EXPECT_ERROR_CONTAINING(ops::causal_attention_f32_ref({.q = q.data(), .k = k.data(), .v = v.data(),
                                                         .row_start = bad.data(), .out = out.data(), .n = n, .nh = nh,
                                                         .nkv = nkv, .hd = hd, .window = 0, .scale = 1.0f}),
                          "row 5 has row_start 4");
  EXPECT_ERROR_CONTAINING(ops::causal_attention_f32_check({.q = q.data(), .k = k.data(), .v = v.data(),
                                                           .row_start = start.data(), .out = out.data(), .n = n,
                                                           .nh = 3, .nkv = 2, .hd = hd}),
                          "bad shape n=11 nh=3 nkv=2");
  EXPECT_ERROR_CONTAINING(ops::causal_attention_f32_check({.q = q.data(), .k = k.data(), .v = v.data(),
                                                           .row_start = start.data(), .out = out.data(), .n = n,
                                                           .nh = nh, .nkv = nkv, .hd = 300}),
                          "head_dim 300 / value head_dim 300 not supported");
  EXPECT_ERROR_CONTAINING(ops::causal_attention_f32_check({.q = q.data(), .k = nullptr, .v = v.data(),
                                                           .row_start = start.data(), .out = out.data(), .n = n,
                                                           .nh = nh, .nkv = nkv, .hd = hd}),
                          "null pointer");
}

// The fp32 outputs are the bf16 paths' values before their rounding: rmsnorm y_f32 (also in place)
// and qk_rope's k/v rows.
TEST(LayerGpuTwins, Fp32OutputsAreTheValuesBeforeRounding) {
  const int64_t n = 5, D = 300;
  const auto x = random_vec(n * D, 1, 2.0f), w = random_vec(D, 2, 0.1f, 1.0f);
  std::vector<uint16_t> y(n * D);
  std::vector<float> yf(n * D), inplace = x;
  ops::rmsnorm_ref({.x = x.data(), .w = w.data(), .y = y.data(), .y_lo = nullptr, .y_f32 = yf.data(), .n = n, .D = D});
  ops::rmsnorm_ref({.x = inplace.data(), .w = w.data(), .y = nullptr, .y_lo = nullptr, .y_f32 = inplace.data(), .n = n,
                    .D = D});
  for (int64_t i = 0; i < n * D; ++i) {
    ASSERT_EQ(y[i], f32_to_bf16(yf[i])) << i;
    ASSERT_EQ(inplace[i], yf[i]) << i;
  }
  EXPECT_ERROR_CONTAINING(ops::rmsnorm_ref({.x = x.data(), .w = w.data(), .n = n, .D = D}), "no output");

  const int nh = 2, nkv = 1, hd = 64;
  const int64_t T = 3, max_len = 4, heads = nh + 2 * nkv;
  const auto qkv = random_vec(T * heads * hd, 3, 1.0f), qn = random_vec(hd, 4, 0.1f, 1.0f),
             kn = random_vec(hd, 5, 0.1f, 1.0f);
  std::vector<float> cos_t, sin_t;
  model::rope_tables(max_len, hd, 10000.0, cos_t, sin_t, false);
  const std::vector<int32_t> slot = {0, 0, 1}, pos = {0, 1, 3};
  std::vector<float> q1(T * nh * hd), q2(T * nh * hd), k(T * nkv * hd), v(T * nkv * hd);
  std::vector<uint16_t> kc(2 * max_len * nkv * hd), vc(2 * max_len * nkv * hd);
  ops::QkRopeArgs a;
  a.qkv = qkv.data();
  a.q_norm = qn.data();
  a.k_norm = kn.data();
  a.cos = cos_t.data();
  a.sin = sin_t.data();
  a.tok_slot = slot.data();
  a.tok_pos = pos.data();
  a.q_out = q1.data();
  a.k_cache = kc.data();
  a.v_cache = vc.data();
  a.T = T;
  a.nh = nh;
  a.nkv = nkv;
  a.hd = hd;
  a.max_len = max_len;
  ops::qk_rope_ref(a);
  ops::QkRopeArgs b = a;
  b.q_out = q2.data();
  b.k_cache = b.v_cache = nullptr;
  b.tok_slot = nullptr;
  b.k_out = k.data();
  b.v_out = v.data();
  ops::qk_rope_ref(b);
  EXPECT_EQ(0, std::memcmp(q1.data(), q2.data(), q1.size() * sizeof(float)));
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < hd; ++i) {
      const int64_t c = (slot[t] * max_len + pos[t]) * nkv * hd + i;
      ASSERT_EQ(kc[c], f32_to_bf16(k[t * hd + i])) << t << " " << i;
      ASSERT_EQ(vc[c], f32_to_bf16(v[t * hd + i])) << t << " " << i;
    }
  b.v_out = nullptr;
  EXPECT_ERROR_CONTAINING(ops::qk_rope_ref(b), "k_out and v_out must be given together");
}

TEST(LayerGpuTwins, RefusalNamesWhatTheGpuAttentionLacks) {
  model::DecoderModel m(attn_spec());
  EXPECT_EQ(compress::gpu_attention_refusal(m.spec(), m.layer(0)), "");
  io::ModelSpec s = attn_spec();
  s.qk_norm = io::QkNorm::None;
  s.head_dim = 48;
  model::LayerWeights L = m.layer(0);
  L.o_bias.assign(s.hidden_size, 0.0f);
  const std::string why = compress::gpu_attention_refusal(s, L);
  EXPECT_NE(why.find("q/k norm is not per head"), std::string::npos) << why;
  EXPECT_NE(why.find("biases"), std::string::npos) << why;
  EXPECT_NE(why.find("head_dim 48"), std::string::npos) << why;
}

namespace {

// compress/mla_cuda.cu's chain through the twins: rmsnorm → q_a → q_a norm → q_b; kv_a →
// mla_split_rope_f32_ref → latent norm → kv_b → mla_expand_kv_f32_ref → causal_attention_f32_ref (d_qk
// keys, d_v values) → o_proj, h += o → post norm; h [n, H] packed sequences, updated; returns X.
std::vector<float> mla_chain(const io::ModelSpec& s, const model::MlaMixer& mla, const model::LayerWeights& L,
                             std::vector<float>& h, const std::vector<int64_t>& offset) {
  const model::MlaDims& d = mla.dims();
  const model::MlaWeights& w = mla.weights();
  const int64_t H = s.hidden_size, nh = d.num_heads, r_q = d.q_lora_rank, r_kv = d.kv_lora_rank;
  const int64_t nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim, dv = d.v_head_dim, dqk = d.qk_head_dim();
  const int64_t n = offset.back();
  int64_t max_T = 1;
  std::vector<int32_t> pos;
  std::vector<int64_t> start;
  for (size_t i = 0; i + 1 < offset.size(); ++i) {
    max_T = std::max(max_T, offset[i + 1] - offset[i]);
    for (int64_t r = offset[i]; r < offset[i + 1]; ++r) {
      pos.push_back(static_cast<int32_t>(r - offset[i]));
      start.push_back(offset[i]);
    }
  }
  const model::RopeTables tables = mla.tables(max_T, false);
  std::vector<float> xn(n * H), qa(n * r_q), q(n * nh * dqk), ckv(n * (r_kv + rope)), latent(n * r_kv),
      k_pe(n * rope), kv(n * nh * (nope + dv)), k(n * nh * dqk), v(n * nh * dv), attn(n * nh * dv), o(n * H), X(n * H);
  ops::rmsnorm_ref({.x = h.data(), .w = L.input_norm.data(), .y = nullptr, .y_lo = nullptr, .y_f32 = xn.data(),
                    .n = n, .D = H, .eps = s.rms_norm_eps});
  model::linear_ref(xn.data(), n, H, w.q_a_proj.data(), r_q, qa.data());
  ops::rmsnorm_ref({.x = qa.data(), .w = w.q_a_norm.data(), .y = nullptr, .y_lo = nullptr, .y_f32 = qa.data(), .n = n,
                    .D = r_q, .eps = model::kMlaLatentNormEps});
  model::linear_ref(qa.data(), n, r_q, w.q_b_proj.data(), nh * dqk, q.data());
  model::linear_ref(xn.data(), n, H, w.kv_a_proj.data(), r_kv + rope, ckv.data());
  ops::mla_split_rope_f32_ref({.ckv = ckv.data(), .q = q.data(), .cos = tables.cos.data(), .sin = tables.sin.data(),
                               .tok_pos = pos.data(), .latent = latent.data(), .k_pe = k_pe.data(), .n = n,
                               .max_len = max_T, .nh = static_cast<int>(nh), .r_kv = static_cast<int>(r_kv),
                               .nope = static_cast<int>(nope), .rope = static_cast<int>(rope),
                               .interleave = d.rope_interleave});
  ops::rmsnorm_ref({.x = latent.data(), .w = w.kv_a_norm.data(), .y = nullptr, .y_lo = nullptr, .y_f32 = latent.data(),
                    .n = n, .D = r_kv, .eps = model::kMlaLatentNormEps});
  model::linear_ref(latent.data(), n, r_kv, w.kv_b_proj.data(), nh * (nope + dv), kv.data());
  ops::mla_expand_kv_f32_ref({.kv = kv.data(), .k_pe = k_pe.data(), .k = k.data(), .v = v.data(), .n = n,
                              .nh = static_cast<int>(nh), .nope = static_cast<int>(nope), .rope = static_cast<int>(rope),
                              .v_dim = static_cast<int>(dv)});
  ops::causal_attention_f32_ref({.q = q.data(), .k = k.data(), .v = v.data(), .row_start = start.data(),
                                 .out = attn.data(), .n = n, .nh = static_cast<int>(nh), .nkv = static_cast<int>(nh),
                                 .hd = static_cast<int>(dqk), .window = 0, .scale = d.softmax_scale,
                                 .hd_v = static_cast<int>(dv)});
  model::linear_ref(attn.data(), n, nh * dv, w.o_proj.data(), H, o.data());
  for (int64_t i = 0; i < n * H; ++i) h[i] += o[i];
  ops::rmsnorm_ref({.x = h.data(), .w = L.post_norm.data(), .y = nullptr, .y_lo = nullptr, .y_f32 = X.data(), .n = n,
                    .D = H, .eps = s.rms_norm_eps});
  return X;
}

// (kChainRelFro bounds it too: measured 1.3e-8 with the twins' plain loops against the mixer's BLAS.)


}  // namespace

TEST(LayerGpuTwins, MlaChainOfTwinsReproducesTheMlaMixer) {
  const io::Checkpoint ckpt(std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3");
  const model::DecoderModel m(ckpt);
  const int64_t layer = 1;  // an MoE layer (first_k_dense_replace 1)
  const model::LayerWeights& L = m.layer(layer);
  const auto* mla = dynamic_cast<const model::MlaMixer*>(L.mixer.get());
  ASSERT_NE(mla, nullptr);
  ASSERT_TRUE(mla->dims().rope_interleave);
  ASSERT_EQ(compress::gpu_attention_refusal(m.spec(), L), "");
  const int64_t H = m.spec().hidden_size;
  const std::vector<int64_t> lens = {1, 23, 9, 40};
  std::vector<int64_t> offset = {0};
  for (int64_t T : lens) offset.push_back(offset.back() + T);
  std::vector<float> h = random_vec(offset.back() * H, 19, 1.0f);
  std::vector<float> h_cpu = h, X_cpu;
  for (size_t i = 0; i < lens.size(); ++i) {
    std::vector<float> hs(h.begin() + offset[i] * H, h.begin() + offset[i + 1] * H);
    m.attention_block(layer, hs, lens[i], {});
    std::copy(hs.begin(), hs.end(), h_cpu.begin() + offset[i] * H);
    const std::vector<float> x = m.moe_input(layer, hs, lens[i]);
    X_cpu.insert(X_cpu.end(), x.begin(), x.end());
  }
  std::vector<float> h_in = h;
  const std::vector<float> X = mla_chain(m.spec(), *mla, L, h, offset);
  std::printf("[mla chain] rel fro h %.2e X %.2e\n", rel_fro(h, h_cpu), rel_fro(X, X_cpu));
  EXPECT_LE(rel_fro(h, h_cpu), kChainRelFro);
  EXPECT_LE(rel_fro(X, X_cpu), kChainRelFro);
  // Without the rotation's de-interleaving the chain must not match (the test sees the RoPE layout).
  model::MlaDims plain = mla->dims();
  plain.rope_interleave = false;
  const model::MlaMixer wrong(plain, mla->weights(), model::rope_frequencies(m.spec().mla.rope,
                                                                              plain.qk_rope_head_dim,
                                                                              m.spec().max_position_embeddings));
  mla_chain(m.spec(), wrong, L, h_in, offset);
  EXPECT_GT(rel_fro(h_in, h_cpu), 1e-4);
}

TEST(LayerGpuTwins, CausalAttentionTwinWithNarrowerValues) {
  const int nh = 3, hd = 48, hd_v = 20;
  const int64_t n = 9, qw = nh * hd, vw = nh * hd_v;
  const std::vector<int64_t> start = {0, 0, 0, 0, 4, 4, 4, 4, 4};
  const auto q = random_vec(n * qw, 4, 1.0f), k = random_vec(n * qw, 5, 1.0f), v = random_vec(n * vw, 6, 1.0f);
  std::vector<float> out(n * vw, NAN);
  const float scale = 0.2f;
  ops::causal_attention_f32_ref({.q = q.data(), .k = k.data(), .v = v.data(), .row_start = start.data(),
                                 .out = out.data(), .n = n, .nh = nh, .nkv = nh, .hd = hd, .window = 0,
                                 .scale = scale, .hd_v = hd_v});
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < nh; ++i) {
      std::vector<double> w;
      double mx = -1e300, sum = 0;
      for (int64_t j = start[t]; j <= t; ++j) {
        double d = 0;
        for (int c = 0; c < hd; ++c) d += static_cast<double>(q[t * qw + i * hd + c]) * k[j * qw + i * hd + c];
        w.push_back(d * scale);
        mx = std::max(mx, w.back());
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int c = 0; c < hd_v; ++c) {
        double o = 0;
        for (int64_t j = start[t]; j <= t; ++j) o += w[j - start[t]] / sum * v[j * vw + i * hd_v + c];
        EXPECT_NEAR(out[t * vw + i * hd_v + c], o, 1e-5) << "t " << t << " head " << i;
      }
    }
}

TEST(LayerGpuTwins, MlaSplitRopeTwinIsTheDefinition) {
  const int nh = 2, r_kv = 5, nope = 3, rope = 4, half = rope / 2;
  const int64_t n = 3, max_len = 7;
  const auto ckv = random_vec(n * (r_kv + rope), 7, 1.0f), q0 = random_vec(n * nh * (nope + rope), 8, 1.0f);
  const auto cs = random_vec(max_len * half, 9, 1.0f), sn = random_vec(max_len * half, 10, 1.0f);
  const std::vector<int32_t> pos = {0, 6, 2};
  for (const bool interleave : {true, false}) {
    std::vector<float> q = q0, latent(n * r_kv), k_pe(n * rope);
    ops::mla_split_rope_f32_ref({.ckv = ckv.data(), .q = q.data(), .cos = cs.data(), .sin = sn.data(),
                                 .tok_pos = pos.data(), .latent = latent.data(), .k_pe = k_pe.data(), .n = n,
                                 .max_len = max_len, .nh = nh, .r_kv = r_kv, .nope = nope, .rope = rope,
                                 .interleave = interleave});
    for (int64_t t = 0; t < n; ++t) {
      for (int i = 0; i < r_kv; ++i) EXPECT_EQ(latent[t * r_kv + i], ckv[t * (r_kv + rope) + i]);
      auto expect_rotated = [&](const float* got, const float* stored, const char* what) {
        std::vector<float> x(stored, stored + rope);
        if (interleave) model::deinterleave_pairs(x.data(), rope);
        model::apply_rope(x.data(), rope, &cs[pos[t] * half], &sn[pos[t] * half]);
        for (int e = 0; e < rope; ++e) EXPECT_EQ(got[e], x[e]) << what << " row " << t << " dim " << e;
      };
      expect_rotated(&k_pe[t * rope], &ckv[t * (r_kv + rope) + r_kv], "k_pe");
      for (int h = 0; h < nh; ++h) {
        const int64_t base = (t * nh + h) * (nope + rope);
        for (int e = 0; e < nope; ++e) EXPECT_EQ(q[base + e], q0[base + e]) << "q_nope untouched";
        expect_rotated(&q[base + nope], &q0[base + nope], "q rope");
      }
    }
  }
  std::vector<float> q = q0, latent(n * r_kv), k_pe(n * rope);
  const std::vector<int32_t> bad = {0, 7, 2};
  EXPECT_ERROR_CONTAINING(ops::mla_split_rope_f32_ref({.ckv = ckv.data(), .q = q.data(), .cos = cs.data(),
                                                       .sin = sn.data(), .tok_pos = bad.data(), .latent = latent.data(),
                                                       .k_pe = k_pe.data(), .n = n, .max_len = max_len, .nh = nh,
                                                       .r_kv = r_kv, .nope = nope, .rope = rope}),
                          "row 1 has position 7, outside [0, 7)");
  EXPECT_ERROR_CONTAINING(ops::mla_split_rope_f32_check({.ckv = ckv.data(), .q = q.data(), .cos = cs.data(),
                                                         .sin = sn.data(), .tok_pos = pos.data(),
                                                         .latent = latent.data(), .k_pe = k_pe.data(), .n = n,
                                                         .max_len = max_len, .nh = nh, .r_kv = r_kv, .nope = nope,
                                                         .rope = 3}),
                          "rope=3");
  EXPECT_ERROR_CONTAINING(ops::mla_expand_kv_f32_check({.kv = ckv.data(), .k_pe = nullptr, .k = q.data(),
                                                        .v = latent.data(), .n = n, .nh = nh, .nope = nope,
                                                        .rope = rope, .v_dim = 2}),
                          "mla_expand_kv_f32: null pointer");
}

TEST(LayerGpuTwins, MlaRefusalNamesWhatTheGpuPathLacks) {
  const io::Checkpoint ckpt(std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3");
  const model::DecoderModel m(ckpt);
  model::LayerWeights L = m.layer(1);
  const auto* mla = dynamic_cast<const model::MlaMixer*>(L.mixer.get());
  ASSERT_NE(mla, nullptr);
  model::MlaDims d = mla->dims();
  d.v_head_dim = 300;
  model::MlaWeights w = mla->weights();
  w.o_bias.assign(d.hidden, 0.0f);
  L.mixer = std::make_shared<model::MlaMixer>(d, w, model::rope_frequencies(m.spec().mla.rope, d.qk_rope_head_dim,
                                                                            m.spec().max_position_embeddings));
  const std::string why = compress::gpu_attention_refusal(m.spec(), L);
  EXPECT_NE(why.find("its MLA projections have biases"), std::string::npos) << why;
  EXPECT_NE(why.find("v 300) pass 256"), std::string::npos) << why;
}

namespace {

// A CPU stand-in for LayerDevice::routed_experts: Σ weight · SwiGLU expert (no Q_a), recording calls.
struct RoutedCalls {
  std::vector<int64_t> rows;
  bool all_to_expert0_weight1 = true, no_quant = true;
};
RoutedCalls g_calls;
std::vector<float> cpu_routed_experts(const std::vector<model::ExpertWeights>& experts, int64_t H, int64_t I,
                                      const std::vector<float>& X, const model::Routes& r, int act_block) {
  g_calls.rows.push_back(r.n);
  g_calls.no_quant = g_calls.no_quant && act_block == 0;
  std::vector<float> y(static_cast<size_t>(r.n * H), 0.0f), g(I), u(I), o(H);
  for (int64_t t = 0; t < r.n; ++t)
    for (int64_t j = 0; j < r.k; ++j) {
      const int32_t e = r.expert[t * r.k + j];
      g_calls.all_to_expert0_weight1 = g_calls.all_to_expert0_weight1 && e == 0 && r.weight[t * r.k + j] == 1.0f;
      const model::ExpertWeights& W = experts.at(static_cast<size_t>(e));
      model::linear_ref(&X[t * H], 1, H, W.gate.data(), I, g.data());
      model::linear_ref(&X[t * H], 1, H, W.up.data(), I, u.data());
      for (int64_t i = 0; i < I; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      model::linear_ref(g.data(), 1, I, W.down.data(), H, o.data());
      for (int64_t c = 0; c < H; ++c) y[t * H + c] += r.weight[t * r.k + j] * o[c];
    }
  return y;
}

}  // namespace

// compress/pipeline.cpp plain_mlp_on_device (a dense layer's MLP or an ungated shared expert in the GPU
// propagation): every row goes to the one expert with weight 1 and no Q_a, in row chunks, in order; the
// result is the model's dense MLP (here the stand-in's plain loops against DecoderModel::dense_mlp).
TEST(LayerGpuTwins, PlainMlpOnDeviceRoutesEveryRowToTheOneExpert) {
  const io::Checkpoint ckpt(std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3");
  const model::DecoderModel m(ckpt);
  const io::ModelSpec& s = m.spec();
  ASSERT_FALSE(s.is_moe_layer(0));
  const int64_t H = s.hidden_size, n = 23;
  const std::vector<float> X = random_vec(n * H, 77, 1.0f);
  compress::LayerDevice dev;
  dev.routed_experts = cpu_routed_experts;
  g_calls = {};
  const std::vector<float> y = compress::plain_mlp_on_device(dev, m.layer(0).dense_mlp, H, s.intermediate_size, X, n, 10);
  EXPECT_EQ(g_calls.rows, (std::vector<int64_t>{10, 10, 3}));
  EXPECT_TRUE(g_calls.all_to_expert0_weight1);
  EXPECT_TRUE(g_calls.no_quant);
  EXPECT_LE(rel_fro(y, m.dense_mlp(0, X, n)), kChainRelFro);
  // The shared expert of an MoE layer (DeepSeek-V3 has no gate on it) the same way, one chunk.
  g_calls = {};
  const std::vector<float> ys =
      compress::plain_mlp_on_device(dev, m.layer(1).shared_expert, H, s.shared_expert_intermediate_size, X, n);
  EXPECT_EQ(g_calls.rows, (std::vector<int64_t>{n}));
  EXPECT_LE(rel_fro(ys, m.shared_expert_forward(1, X, n)), kChainRelFro);
  compress::LayerDevice none;
  EXPECT_ERROR_CONTAINING(compress::plain_mlp_on_device(none, m.layer(0).dense_mlp, H, s.intermediate_size, X, n),
                          "no routed-expert path");
}
