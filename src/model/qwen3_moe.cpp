// Qwen3-MoE forward on the CPU, fp32 math (transformers' Qwen3MoeForCausalLM run in float32 on
// weights upcast from bf16 is the reference; tests/test_model_parity.cpp checks it).
//
// Linear layers are OpenBLAS sgemm calls in PyTorch layout (y = x Wᵀ, W [N, K]); each has a
// plain-loop `_ref` twin. The non-obvious decision: the routed-expert combine adds expert outputs
// to each token in ASCENDING EXPERT ID order starting from zero, as transformers' index_add_ loop
// does, and never in the order threads finish — so the result is bitwise independent of the thread
// count and the expert GEMMs can run in parallel (experts write private buffers, one serial
// combine pass follows).
// Not batch-invariant: OpenBLAS rounds a row differently depending on the GEMM's M (row 0 of a
// [M, 256] × [256, 128] sgemm changed bits for 197 of M = 1..200 on the CI machine), so a token's
// expert output bits depend on how many tokens share its expert; results agree to fp32 noise.
#include "model/qwen3_moe.h"
#include "model/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/swiglu.h"
#include "core/threads.h"
#include "format/nvfp4.h"

namespace moesq::model {

namespace {

// y [M, N] = x [M, K] · W [N, K]ᵀ  (PyTorch Linear, no bias).
void linear(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), 1.0f, x, static_cast<int>(K), W, static_cast<int>(K), 0.0f, y,
              static_cast<int>(N));
}

void linear_ref(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * W[n * K + k];
      y[m * N + n] = acc;
    }
}

// Causal softmax of one score row s[0..t] in place (fp32, max-subtracted); entries > t set to 0.
void causal_softmax_row(float* s, int64_t t, int64_t T) {
  float mx = s[0];
  for (int64_t j = 1; j <= t; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j <= t; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j <= t; ++j) s[j] *= inv;
  for (int64_t j = t + 1; j < T; ++j) s[j] = 0.0f;
}

// Query rows per causal attention block (a multiple of the sgemm micro-tile; 64 keeps S in L2).
constexpr int64_t kAttnBlockM = 64;

int intra_threads(int t) { return t > 0 ? t : num_threads(); }

}  // namespace

Qwen3Moe::Qwen3Moe(io::ModelSpec spec) : spec_(std::move(spec)) {
  const auto& s = spec_;
  MOESQ_CHECK(s.hidden_size > 0 && s.num_layers > 0 && s.num_heads > 0 && s.num_kv_heads > 0 &&
                  s.head_dim > 0 && s.vocab_size > 0,
              "qwen3_moe spec: hidden_size, num_layers, heads, head_dim and vocab_size must be > 0");
  MOESQ_CHECK(s.num_heads % s.num_kv_heads == 0, "qwen3_moe spec: num_attention_heads (", s.num_heads,
              ") is not a multiple of num_key_value_heads (", s.num_kv_heads, ")");
  MOESQ_CHECK(s.head_dim % 2 == 0, "qwen3_moe spec: head_dim ", s.head_dim, " must be even (RoPE)");
  const int64_t H = s.hidden_size, hd = s.head_dim, I = s.moe_intermediate_size;
  embed_.assign(s.vocab_size * H, 0.0f);
  final_norm_.assign(H, 0.0f);
  lm_head_.assign(s.vocab_size * H, 0.0f);
  layers_.resize(s.num_layers);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    LayerWeights& L = layers_[l];
    L.input_norm.assign(H, 0.0f);
    L.q_proj.assign(s.num_heads * hd * H, 0.0f);
    L.k_proj.assign(s.num_kv_heads * hd * H, 0.0f);
    L.v_proj.assign(s.num_kv_heads * hd * H, 0.0f);
    L.o_proj.assign(H * s.num_heads * hd, 0.0f);
    if (s.attention_bias) {
      L.q_bias.assign(s.num_heads * hd, 0.0f);
      L.k_bias.assign(s.num_kv_heads * hd, 0.0f);
      L.v_bias.assign(s.num_kv_heads * hd, 0.0f);
      L.o_bias.assign(H, 0.0f);
    }
    L.q_norm.assign(hd, 0.0f);
    L.k_norm.assign(hd, 0.0f);
    L.post_norm.assign(H, 0.0f);
    if (s.is_moe_layer(l)) {
      L.router.assign(s.num_experts * H, 0.0f);
      L.experts.resize(s.num_experts);
      for (auto& e : L.experts) {
        e.gate.assign(I * H, 0.0f);
        e.up.assign(I * H, 0.0f);
        e.down.assign(H * I, 0.0f);
      }
    } else {
      const int64_t Id = s.intermediate_size;
      L.dense_mlp.gate.assign(Id * H, 0.0f);
      L.dense_mlp.up.assign(Id * H, 0.0f);
      L.dense_mlp.down.assign(H * Id, 0.0f);
    }
  }
}

std::vector<float> Qwen3Moe::embed(const std::vector<int32_t>& tokens) const {
  const int64_t H = spec_.hidden_size;
  std::vector<float> h(tokens.size() * H);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t id = tokens[t];
    MOESQ_CHECK(id >= 0 && id < spec_.vocab_size, "token id ", id, " at position ", t,
                " is outside the vocabulary [0, ", spec_.vocab_size, ")");
    std::memcpy(h.data() + t * H, embed_.data() + static_cast<int64_t>(id) * H, H * sizeof(float));
  }
  return h;
}

// Qwen3MoeAttention on one causal sequence: q/k per-head RMSNorm BEFORE RoPE, GQA (query head h
// reads kv head h / (nh / nkv)), scores · hd^-½, fp32 softmax, o_proj, residual add.
void Qwen3Moe::attention_block(int64_t l, std::vector<float>& h, int64_t T, const ForwardOptions& fo) const {
  const auto& s = spec_;
  const LayerWeights& L = layers_.at(l);
  const int64_t H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  const int64_t qw = nh * hd, kw = nkv * hd, half = hd / 2;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == T * H, "attention_block: h has ", h.size(),
              " values, expected T·H = ", T * H);
  if (T == 0) return;
  std::vector<float> x(T * H);  // [T, H]
  rmsnorm_rows(h.data(), T, H, L.input_norm.data(), s.rms_norm_eps, x.data());
  std::vector<float> q(T * qw), k(T * kw), v(T * kw);  // [T, nh·hd], [T, nkv·hd] ×2
  linear(x.data(), T, H, L.q_proj.data(), qw, q.data());
  linear(x.data(), T, H, L.k_proj.data(), kw, k.data());
  linear(x.data(), T, H, L.v_proj.data(), kw, v.data());
  add_bias_rows(q.data(), T, qw, L.q_bias);
  add_bias_rows(k.data(), T, kw, L.k_bias);
  add_bias_rows(v.data(), T, kw, L.v_bias);
  rmsnorm_rows(q.data(), T * nh, hd, L.q_norm.data(), s.rms_norm_eps, q.data());
  rmsnorm_rows(k.data(), T * nkv, hd, L.k_norm.data(), s.rms_norm_eps, k.data());
  std::vector<float> cos_t, sin_t;  // [T, hd/2]
  rope_tables(T, hd, s.rope_theta, cos_t, sin_t);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < nh; ++i) apply_rope(&q[t * qw + i * hd], hd, &cos_t[t * half], &sin_t[t * half]);
    for (int64_t i = 0; i < nkv; ++i) apply_rope(&k[t * kw + i * hd], hd, &cos_t[t * half], &sin_t[t * half]);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t group = nh / nkv;
  std::vector<float> attn(T * qw);  // [T, nh·hd]
  parallel_for(
      nh,
      [&](int64_t i) {
        const int64_t kv = i / group;
        // Causal blocking: query rows [r0, r0 + m) only need keys [0, r0 + m), so scores and P·V
        // are computed per block of kAttnBlockM rows over that prefix (≈ half the FLOPs of a full
        // T × T product at T = 512). S: [m, r0 + m] scores → probabilities, per-thread scratch
        // reused across calls (a fresh 1 MiB vector per head and layer cost ~10 % of an eval in
        // page faults and memset).
        thread_local std::vector<float> S;
        if (S.size() < static_cast<size_t>(kAttnBlockM * T)) S.resize(kAttnBlockM * T);
        for (int64_t r0 = 0; r0 < T; r0 += kAttnBlockM) {
          const int64_t m = std::min<int64_t>(kAttnBlockM, T - r0), cols = r0 + m;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, cols, hd, scale,
                      q.data() + r0 * qw + i * hd, qw, k.data() + kv * hd, kw, 0.0f, S.data(), cols);
          for (int64_t rr = 0; rr < m; ++rr) causal_softmax_row(&S[rr * cols], r0 + rr, cols);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hd, cols, 1.0f, S.data(), cols,
                      v.data() + kv * hd, kw, 0.0f, attn.data() + r0 * qw + i * hd, qw);
        }
      },
      std::min<int>(intra_threads(fo.threads), static_cast<int>(nh)));
  std::vector<float> o(T * H);  // [T, H]
  linear(attn.data(), T, qw, L.o_proj.data(), H, o.data());
  add_bias_rows(o.data(), T, H, L.o_bias);
  for (int64_t i = 0; i < T * H; ++i) h[i] += o[i];
}

void Qwen3Moe::attention_block_ref(int64_t l, std::vector<float>& h, int64_t T) const {
  const auto& s = spec_;
  const LayerWeights& L = layers_.at(l);
  const int64_t H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  const int64_t qw = nh * hd, kw = nkv * hd, half = hd / 2;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == T * H, "attention_block_ref: h has ", h.size(),
              " values, expected T·H = ", T * H);
  std::vector<float> x(T * H), q(T * qw), k(T * kw), v(T * kw);
  rmsnorm_rows(h.data(), T, H, L.input_norm.data(), s.rms_norm_eps, x.data());
  linear_ref(x.data(), T, H, L.q_proj.data(), qw, q.data());
  linear_ref(x.data(), T, H, L.k_proj.data(), kw, k.data());
  linear_ref(x.data(), T, H, L.v_proj.data(), kw, v.data());
  add_bias_rows(q.data(), T, qw, L.q_bias);
  add_bias_rows(k.data(), T, kw, L.k_bias);
  add_bias_rows(v.data(), T, kw, L.v_bias);
  rmsnorm_rows(q.data(), T * nh, hd, L.q_norm.data(), s.rms_norm_eps, q.data());
  rmsnorm_rows(k.data(), T * nkv, hd, L.k_norm.data(), s.rms_norm_eps, k.data());
  std::vector<float> cos_t, sin_t;
  rope_tables(T, hd, s.rope_theta, cos_t, sin_t);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < nh; ++i) apply_rope(&q[t * qw + i * hd], hd, &cos_t[t * half], &sin_t[t * half]);
    for (int64_t i = 0; i < nkv; ++i) apply_rope(&k[t * kw + i * hd], hd, &cos_t[t * half], &sin_t[t * half]);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> attn(T * qw, 0.0f), p(T);
  for (int64_t i = 0; i < nh; ++i) {
    const int64_t kv = i / (nh / nkv);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j <= t; ++j) {
        float d = 0.0f;
        for (int64_t c = 0; c < hd; ++c) d += q[t * qw + i * hd + c] * k[j * kw + kv * hd + c];
        p[j] = d * scale;
      }
      causal_softmax_row(p.data(), t, T);
      for (int64_t j = 0; j <= t; ++j)
        for (int64_t c = 0; c < hd; ++c) attn[t * qw + i * hd + c] += p[j] * v[j * kw + kv * hd + c];
    }
  }
  std::vector<float> o(T * H);
  linear_ref(attn.data(), T, qw, L.o_proj.data(), H, o.data());
  add_bias_rows(o.data(), T, H, L.o_bias);
  for (int64_t i = 0; i < T * H; ++i) h[i] += o[i];
}

std::vector<float> Qwen3Moe::moe_input(int64_t l, const std::vector<float>& h, int64_t n) const {
  const int64_t H = spec_.hidden_size;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == n * H, "moe_input: h has ", h.size(),
              " values, expected n·H = ", n * H);
  std::vector<float> x(n * H);
  rmsnorm_rows(h.data(), n, H, layers_.at(l).post_norm.data(), spec_.rms_norm_eps, x.data());
  return x;
}

// Qwen3MoeSparseMoeBlock router: logits = x · Wgᵀ, p = softmax(logits) in fp32, top-k of p
// (descending; equal probabilities → lower expert id), then p_topk / Σ p_topk if norm_topk_prob.
Routes Qwen3Moe::route(int64_t l, const std::vector<float>& x, int64_t n) const {
  const auto& s = spec_;
  const int64_t H = s.hidden_size, E = s.num_experts, K = s.top_k;
  MOESQ_CHECK(s.is_moe_layer(l), "route: layer ", l, " is a dense MLP layer (mlp_only_layers)");
  MOESQ_CHECK(K >= 1 && K <= E, "route: num_experts_per_tok ", K, " not in [1, ", E, "]");
  MOESQ_CHECK(static_cast<int64_t>(x.size()) == n * H, "route: x has ", x.size(),
              " values, expected n·H = ", n * H);
  Routes r;
  r.n = n;
  r.k = K;
  r.logits.resize(n * E);
  r.expert.resize(n * K);
  r.weight.resize(n * K);
  linear(x.data(), n, H, layers_.at(l).router.data(), E, r.logits.data());
  std::vector<float> p(E);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < n; ++t) {
    const float* z = &r.logits[t * E];
    const float mx = *std::max_element(z, z + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - mx));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
      return p[a] > p[b] || (p[a] == p[b] && a < b);
    });
    float wsum = 0.0f;
    for (int64_t j = 0; j < K; ++j) wsum += p[order[j]];
    for (int64_t j = 0; j < K; ++j) {
      r.expert[t * K + j] = order[j];
      r.weight[t * K + j] = s.norm_topk_prob ? p[order[j]] / wsum : p[order[j]];
    }
  }
  return r;
}

// SwiGLU expert: y = down(silu(gate x) ⊙ up x). With act_quant (W4A4), the expert input rows and
// the SwiGLU output rows are NVFP4-fake-quantized (dynamic, act_block elements per UE4M3 scale)
// before the GEMMs that consume them (paper Eq. 4, Q_a).
namespace {
// Q_a over the rows x [n, K]; a non-finite activation is an Error naming the row and the projection
// whose input it is (the caller adds layer and expert).
void quantize_activation_rows(float* x, int64_t n, int64_t K, int block, const char* what) {
  for (int64_t r = 0; r < n; ++r) {
    try {
      format::quantize_activation_row(&x[r * K], K, block);
    } catch (const Error& e) {
      MOESQ_FAIL(what, " row ", r, ": ", e.what());
    }
  }
}
}  // namespace

std::vector<float> swiglu_forward(const float* gate, const float* up, const float* down, int64_t H, int64_t I,
                                  const float* x, int64_t n, int act_block, std::vector<float>* inter) {
  std::vector<float> y(n * H);  // [n, H]
  if (inter) inter->clear();
  if (n == 0) return y;
  std::vector<float> xq;  // [n, H] quantized copy of x (act_block > 0 only)
  if (act_block > 0) {
    xq.assign(x, x + n * H);
    quantize_activation_rows(xq.data(), n, H, act_block, "gate_proj/up_proj input");
    x = xq.data();
  }
  std::vector<float> g(n * I), u(n * I);  // [n, I]
  linear(x, n, H, gate, I, g.data());
  linear(x, n, H, up, I, u.data());
  for (int64_t i = 0; i < n * I; ++i) g[i] = silu_mul(g[i], u[i]);
  if (act_block > 0) quantize_activation_rows(g.data(), n, I, act_block, "down_proj input");
  linear(g.data(), n, I, down, H, y.data());
  if (inter) *inter = std::move(g);
  return y;
}

std::vector<float> Qwen3Moe::expert_forward(int64_t l, int64_t e, const float* x, int64_t n,
                                            const ForwardOptions& fo) const {
  const ExpertWeights& W = layers_.at(l).experts.at(e);
  try {
    return swiglu_forward(W.gate.data(), W.up.data(), W.down.data(), spec_.hidden_size, spec_.moe_intermediate_size,
                          x, n, fo.expert_act_block(), nullptr);
  } catch (const Error& err) {
    MOESQ_FAIL("layer ", l, " expert ", e, ": ", err.what());
  }
}

std::vector<float> Qwen3Moe::expert_forward_ref(int64_t l, int64_t e, const float* x, int64_t n,
                                                const ForwardOptions& fo) const {
  const int64_t H = spec_.hidden_size, I = spec_.moe_intermediate_size;
  const ExpertWeights& W = layers_.at(l).experts.at(e);
  std::vector<float> xin(x, x + n * H), g(n * I), u(n * I), y(n * H);
  const std::string where = "layer " + std::to_string(l) + " expert " + std::to_string(e) + " ";
  if (fo.act_quant) quantize_activation_rows(xin.data(), n, H, fo.act_block, (where + "gate_proj/up_proj input").c_str());
  linear_ref(xin.data(), n, H, W.gate.data(), I, g.data());
  linear_ref(xin.data(), n, H, W.up.data(), I, u.data());
  for (int64_t i = 0; i < n * I; ++i) g[i] = silu_mul(g[i], u[i]);
  if (fo.act_quant) quantize_activation_rows(g.data(), n, I, fo.act_block, (where + "down_proj input").c_str());
  linear_ref(g.data(), n, I, W.down.data(), H, y.data());
  return y;
}

std::vector<float> Qwen3Moe::dense_mlp(int64_t l, const std::vector<float>& x, int64_t n) const {
  const int64_t H = spec_.hidden_size, I = spec_.intermediate_size;
  const ExpertWeights& W = layers_.at(l).dense_mlp;
  MOESQ_CHECK(static_cast<int64_t>(W.gate.size()) == I * H, "dense_mlp: layer ", l,
              " has no dense MLP weights");
  std::vector<float> g(n * I), u(n * I), y(n * H);
  linear(x.data(), n, H, W.gate.data(), I, g.data());
  linear(x.data(), n, H, W.up.data(), I, u.data());
  for (int64_t i = 0; i < n * I; ++i) g[i] = silu_mul(g[i], u[i]);
  linear(g.data(), n, I, W.down.data(), H, y.data());
  return y;
}

// Gather the rows routed to each expert, one GEMM per projection per expert (in parallel), then
// combine y[t] = Σ_j w[t,j] · y_{e_j}(x_t) in ascending expert id order (see the file header).
std::vector<float> Qwen3Moe::moe_block(int64_t l, const std::vector<float>& x, const Routes& r,
                                       const ForwardOptions& fo) const {
  const int64_t H = spec_.hidden_size, E = spec_.num_experts, n = r.n, K = r.k;
  MOESQ_CHECK(static_cast<int64_t>(x.size()) == n * H, "moe_block: x has ", x.size(),
              " values, expected n·H = ", n * H);
  // Routes of each expert, as flat route ids t·k + j, ascending (= token order).
  std::vector<std::vector<int64_t>> routes_of(E);
  for (int64_t i = 0; i < n * K; ++i) {
    const int32_t e = r.expert[i];
    MOESQ_CHECK(e >= 0 && e < E, "moe_block: route ", i, " names expert ", e, " of ", E);
    routes_of[e].push_back(i);
  }
  std::vector<float> out(n * K * H);  // [n·k, H] expert output of each route (unweighted)
  parallel_for(
      E,
      [&](int64_t e) {
        const auto& ids = routes_of[e];
        const int64_t ne = static_cast<int64_t>(ids.size());
        if (ne == 0) return;
        std::vector<float> xe(ne * H);  // [n_e, H] gathered rows
        for (int64_t i = 0; i < ne; ++i)
          std::memcpy(&xe[i * H], &x[(ids[i] / K) * H], H * sizeof(float));
        const std::vector<float> ye = expert_forward(l, e, xe.data(), ne, fo);
        for (int64_t i = 0; i < ne; ++i) std::memcpy(&out[ids[i] * H], &ye[i * H], H * sizeof(float));
      },
      intra_threads(fo.threads));
  std::vector<float> y(n * H, 0.0f);
  std::vector<int64_t> slot(K);
  for (int64_t t = 0; t < n; ++t) {
    std::iota(slot.begin(), slot.end(), 0);
    std::sort(slot.begin(), slot.end(),
              [&](int64_t a, int64_t b) { return r.expert[t * K + a] < r.expert[t * K + b]; });
    float* yt = &y[t * H];
    for (int64_t j : slot) {
      const float w = r.weight[t * K + j];
      const float* o = &out[(t * K + j) * H];
      for (int64_t c = 0; c < H; ++c) yt[c] += o[c] * w;
    }
  }
  return y;
}

std::vector<float> Qwen3Moe::logits(const std::vector<float>& h, int64_t T) const {
  const int64_t H = spec_.hidden_size, V = spec_.vocab_size;
  std::vector<float> x(T * H), z(T * V);
  rmsnorm_rows(h.data(), T, H, final_norm_.data(), spec_.rms_norm_eps, x.data());
  linear(x.data(), T, H, lm_head_.data(), V, z.data());
  return z;
}

std::vector<float> Qwen3Moe::forward(const std::vector<int32_t>& tokens, const ForwardOptions& fo,
                                     Trace* trace) const {
  const int64_t T = static_cast<int64_t>(tokens.size()), H = spec_.hidden_size;
  std::vector<float> h = embed(tokens);  // [T, H]
  if (trace) {
    *trace = Trace{};
    trace->hidden.push_back(h);
  }
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    attention_block(l, h, T, fo);
    const std::vector<float> x = moe_input(l, h, T);
    std::vector<float> y;
    if (spec_.is_moe_layer(l)) {
      Routes r = route(l, x, T);
      y = moe_block(l, x, r, fo);
      if (trace) {
        trace->router_logits.push_back(r.logits);
        trace->routes.push_back(std::move(r));
      }
    } else {
      y = dense_mlp(l, x, T);
      if (trace) {
        trace->router_logits.emplace_back();
        trace->routes.emplace_back();
      }
    }
    for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
    if (trace) {
      if (l + 1 < spec_.num_layers) {
        trace->hidden.push_back(h);
      } else {  // HF's last hidden state is after the final norm
        std::vector<float> hn(T * H);
        rmsnorm_rows(h.data(), T, H, final_norm_.data(), spec_.rms_norm_eps, hn.data());
        trace->hidden.push_back(std::move(hn));
      }
    }
  }
  return logits(h, T);
}

double Qwen3Moe::window_nll(const std::vector<int32_t>& tokens, const ForwardOptions& fo,
                            int64_t* predicted) const {
  const int64_t T = static_cast<int64_t>(tokens.size()), V = spec_.vocab_size;
  MOESQ_CHECK(T >= 2, "window_nll: a window needs at least 2 tokens, got ", T);
  const std::vector<float> z = forward(tokens, fo);  // [T, V]
  double total = 0.0;
  for (int64_t t = 0; t + 1 < T; ++t) {
    const float* zt = &z[t * V];
    const double mx = *std::max_element(zt, zt + V);
    double se = 0.0;
    for (int64_t v = 0; v < V; ++v) se += std::exp(static_cast<double>(zt[v]) - mx);
    total += (mx + std::log(se)) - static_cast<double>(zt[tokens[t + 1]]);
  }
  if (predicted) *predicted = T - 1;
  return total / static_cast<double>(T - 1);
}

}  // namespace moesq::model
