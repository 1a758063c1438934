// The generic MoE decoder on the CPU, fp32 math (transformers' *ForCausalLM of each family run in
// float32 on weights upcast from bf16 is the reference; tests/model/test_parity.cpp (Qwen3-MoE) and
// tests/model/test_family_parity.cpp check it). The mixer is model/mixers/, the router model/router.cpp.
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
#include "model/decoder.h"
#include "model/mixers/attention.h"
#include "model/tensor_math.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/progress.h"
#include "core/swiglu.h"
#include "core/threads.h"
#include "format/nvfp4.h"

namespace moesq::model {

DecoderModel::DecoderModel(io::ModelSpec spec) : DecoderModel(std::move(spec), true) {}

DecoderModel::DecoderModel(io::ModelSpec spec, bool allocate_experts) : spec_(std::move(spec)) {
  const auto& s = spec_;
  MOESQ_CHECK(s.hidden_size > 0 && s.num_layers > 0 && s.num_heads > 0 && s.num_kv_heads > 0 &&
                  s.head_dim > 0 && s.vocab_size > 0,
              "model spec: hidden_size, num_layers, heads, head_dim and vocab_size must be > 0");
  MOESQ_CHECK(s.num_heads % s.num_kv_heads == 0, "model spec: num_attention_heads (", s.num_heads,
              ") is not a multiple of num_key_value_heads (", s.num_kv_heads, ")");
  MOESQ_CHECK(s.head_dim % 2 == 0, "model spec: head_dim ", s.head_dim, " must be even (RoPE)");
  const int64_t H = s.hidden_size, hd = s.head_dim, I = s.moe_intermediate_size;
  embed_.assign(s.vocab_size * H, 0.0f);
  final_norm_.assign(H, 0.0f);
  lm_head_.assign(s.vocab_size * H, 0.0f);
  layers_.resize(s.num_layers);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    LayerWeights& L = layers_[l];
    L.input_norm.assign(H, 0.0f);
    L.attention_window = s.window_of(l);
    L.q_proj.assign(s.num_heads * hd * H, 0.0f);
    L.k_proj.assign(s.num_kv_heads * hd * H, 0.0f);
    L.v_proj.assign(s.num_kv_heads * hd * H, 0.0f);
    L.o_proj.assign(H * s.num_heads * hd, 0.0f);
    if (s.attention_bias || s.qkv_bias) {
      L.q_bias.assign(s.num_heads * hd, 0.0f);
      L.k_bias.assign(s.num_kv_heads * hd, 0.0f);
      L.v_bias.assign(s.num_kv_heads * hd, 0.0f);
    }
    if (s.attention_bias) L.o_bias.assign(H, 0.0f);
    if (s.qk_norm == io::QkNorm::PerHead) {
      L.q_norm.assign(hd, 0.0f);
      L.k_norm.assign(hd, 0.0f);
    } else if (s.qk_norm == io::QkNorm::Whole) {
      L.q_norm.assign(s.num_heads * hd, 0.0f);
      L.k_norm.assign(s.num_kv_heads * hd, 0.0f);
    }
    L.post_norm.assign(H, 0.0f);
    if (s.is_moe_layer(l)) {
      L.router.assign(s.num_experts * H, 0.0f);
      if (s.router_correction_bias) L.router_bias.assign(s.num_experts, 0.0f);
      if (s.router_logit_bias) L.router_logit_bias.assign(s.num_experts, 0.0f);
      if (s.num_shared_experts > 0) {
        const int64_t Is = s.shared_expert_intermediate_size;
        L.shared_expert.gate.assign(Is * H, 0.0f);
        L.shared_expert.up.assign(Is * H, 0.0f);
        L.shared_expert.down.assign(H * Is, 0.0f);
        if (s.shared_expert_gate) L.shared_expert_gate.assign(H, 0.0f);
      }
      L.experts.resize(allocate_experts ? s.num_experts : 0);
      for (auto& e : L.experts) {
        e.gate.assign(I * H, 0.0f);
        e.up.assign(I * H, 0.0f);
        e.down.assign(H * I, 0.0f);
        if (s.expert_bias) {
          e.gate_bias.assign(I, 0.0f);
          e.up_bias.assign(I, 0.0f);
          e.down_bias.assign(H, 0.0f);
        }
      }
    } else {
      const int64_t Id = s.intermediate_size;
      L.dense_mlp.gate.assign(Id * H, 0.0f);
      L.dense_mlp.up.assign(Id * H, 0.0f);
      L.dense_mlp.down.assign(H * Id, 0.0f);
    }
  }
}

std::vector<float> DecoderModel::embed(const std::vector<int32_t>& tokens) const {
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

void DecoderModel::attention_block(int64_t l, std::vector<float>& h, int64_t T, const ForwardOptions& fo) const {
  const auto& s = spec_;
  const LayerWeights& L = layers_.at(l);
  const int64_t H = s.hidden_size;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == T * H, "attention_block: h has ", h.size(),
              " values, expected T·H = ", T * H);
  if (T == 0) return;
  std::vector<float> x(T * H);  // [T, H]
  rmsnorm_rows(h.data(), T, H, L.input_norm.data(), s.rms_norm_eps, x.data());
  const std::vector<float> o =
      L.mixer ? L.mixer->forward(x.data(), T, fo) : gqa_attention(s, L, x.data(), T, fo);  // [T, H]
  MOESQ_CHECK(static_cast<int64_t>(o.size()) == T * H, "layer ", l, " mixer ", L.mixer ? L.mixer->name() : "attention",
              " returned ", o.size(), " values, expected T·H = ", T * H);
  for (int64_t i = 0; i < T * H; ++i) h[i] += o[i];
}

void DecoderModel::attention_block_ref(int64_t l, std::vector<float>& h, int64_t T, const ForwardOptions& fo) const {
  const auto& s = spec_;
  const LayerWeights& L = layers_.at(l);
  const int64_t H = s.hidden_size;
  MOESQ_CHECK(!L.mixer || L.mixer->has_forward_ref(), "attention_block_ref: layer ", l, "'s ",
              L.mixer ? L.mixer->name() : "", " mixer has no plain-loop twin");
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == T * H, "attention_block_ref: h has ", h.size(),
              " values, expected T·H = ", T * H);
  std::vector<float> x(T * H);
  rmsnorm_rows(h.data(), T, H, L.input_norm.data(), s.rms_norm_eps, x.data());
  const std::vector<float> o = L.mixer ? L.mixer->forward_ref(x.data(), T, fo) : gqa_attention_ref(s, L, x.data(), T, fo);
  for (int64_t i = 0; i < T * H; ++i) h[i] += o[i];
}

std::vector<float> DecoderModel::moe_input(int64_t l, const std::vector<float>& h, int64_t n) const {
  const int64_t H = spec_.hidden_size;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == n * H, "moe_input: h has ", h.size(),
              " values, expected n·H = ", n * H);
  std::vector<float> x(n * H);
  rmsnorm_rows(h.data(), n, H, layers_.at(l).post_norm.data(), spec_.rms_norm_eps, x.data());
  return x;
}

// Router logits = x · Wgᵀ (fp32 GEMM), then the family's selection (model/router.h).
Routes DecoderModel::route(int64_t l, const std::vector<float>& x, int64_t n) const {
  const auto& s = spec_;
  const int64_t H = s.hidden_size, E = s.num_experts;
  MOESQ_CHECK(s.is_moe_layer(l), "route: layer ", l, " is a dense MLP layer (mlp_only_layers)");
  MOESQ_CHECK(static_cast<int64_t>(x.size()) == n * H, "route: x has ", x.size(),
              " values, expected n·H = ", n * H);
  std::vector<float> logits(n * E);  // [n, E]
  linear(x.data(), n, H, layers_.at(l).router.data(), E, logits.data());
  return route_logits(l, std::move(logits), n);
}

Routes DecoderModel::route_logits(int64_t l, std::vector<float> logits, int64_t n) const {
  const auto& s = spec_;
  const int64_t E = s.num_experts;
  MOESQ_CHECK(s.is_moe_layer(l), "route: layer ", l, " is a dense MLP layer (mlp_only_layers)");
  MOESQ_CHECK(static_cast<int64_t>(logits.size()) == n * E, "route: ", logits.size(), " logits, expected n·E = ",
              n * E);
  add_bias_rows(logits.data(), n, E, layers_.at(l).router_logit_bias);  // gpt-oss: x Wᵀ + b
  const std::vector<float>& bias = layers_.at(l).router_bias;
  return select_routes(router_spec(s), std::move(logits), n, bias.empty() ? nullptr : bias.data());
}

// SwiGLU expert: y = down(silu(gate x) ⊙ up x). With act_quant (W4A4), the expert input rows and
// the SwiGLU output rows are NVFP4-fake-quantized (dynamic, act_block elements per UE4M3 scale)
// before the GEMMs that consume them (paper Eq. 4, Q_a).
namespace {
// Q_a over the rows x [n, K]; a non-finite activation is an Error naming the row and the projection
// whose input it is (the caller adds layer and expert). static_scale > 0: that γ_a for every row (a
// checkpoint's static input_global_scale; block scales still per block), the same block rule.
void quantize_activation_rows(float* x, int64_t n, int64_t K, int block, const char* what, float static_scale) {
  for (int64_t r = 0; r < n; ++r) {
    try {
      if (static_scale > 0.0f) {
        for (int64_t k = 0; k < K; ++k)
          MOESQ_CHECK(std::isfinite(x[r * K + k]), "activation quantization: non-finite activation ", x[r * K + k],
                      " at column ", k, " of K=", K);
        MOESQ_CHECK(K % block == 0, "activation quantization: K=", K, " is not a multiple of the block size ", block);
        format::nvfp4_fake_quant_blocks(&x[r * K], K, block, static_scale);
      } else {
        format::quantize_activation_row(&x[r * K], K, block);
      }
    } catch (const Error& e) {
      MOESQ_FAIL(what, " row ", r, ": ", e.what());
    }
  }
}
}  // namespace

ExpertVariant expert_variant(const io::ModelSpec& spec, const ExpertWeights& w) {
  ExpertVariant v;
  v.gate_bias = w.gate_bias.empty() ? nullptr : w.gate_bias.data();
  v.up_bias = w.up_bias.empty() ? nullptr : w.up_bias.data();
  v.down_bias = w.down_bias.empty() ? nullptr : w.down_bias.data();
  v.clamped = spec.clamped_swiglu;
  v.alpha = static_cast<float>(spec.swiglu_alpha);
  v.limit = static_cast<float>(spec.swiglu_limit);
  v.gate_up_act_scale = w.gate_up_act_scale;
  v.down_act_scale = w.down_act_scale;
  return v;
}

namespace {

// The expert's elementwise step on g, u [n, I] (biases first): g ← act(g + b_g, u + b_u), in place.
void expert_activation(float* g, const float* u, int64_t n, int64_t I, const ExpertVariant& v) {
  if (!v.clamped && !v.gate_bias && !v.up_bias) {  // plain SwiGLU, in the order compressed bytes depend on
    for (int64_t i = 0; i < n * I; ++i) g[i] = silu_mul(g[i], u[i]);
    return;
  }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < I; ++i) {
      const float gb = g[t * I + i] + (v.gate_bias ? v.gate_bias[i] : 0.0f);
      const float ub = u[t * I + i] + (v.up_bias ? v.up_bias[i] : 0.0f);
      g[t * I + i] = v.clamped ? clamped_swiglu(gb, ub, v.alpha, v.limit) : silu_mul(gb, ub);
    }
}

void add_down_bias(float* y, int64_t n, int64_t H, const ExpertVariant& v) {
  if (!v.down_bias) return;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < H; ++c) y[t * H + c] += v.down_bias[c];
}

using LinearFn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*);

// swiglu_forward and its twin: one body, the linear passed in (BLAS or plain loops).
std::vector<float> expert_mlp(LinearFn lin, const float* gate, const float* up, const float* down, int64_t H,
                              int64_t I, const float* x, int64_t n, int act_block, std::vector<float>* inter,
                              const ExpertVariant& v) {
  std::vector<float> y(n * H);  // [n, H]
  if (inter) inter->clear();
  if (n == 0) return y;
  std::vector<float> xq;  // [n, H] quantized copy of x (act_block > 0 only)
  if (act_block > 0) {
    xq.assign(x, x + n * H);
    quantize_activation_rows(xq.data(), n, H, act_block, "gate_proj/up_proj input", v.gate_up_act_scale);
    x = xq.data();
  }
  std::vector<float> g(n * I), u(n * I);  // [n, I]
  lin(x, n, H, gate, I, g.data());
  lin(x, n, H, up, I, u.data());
  expert_activation(g.data(), u.data(), n, I, v);
  if (act_block > 0) quantize_activation_rows(g.data(), n, I, act_block, "down_proj input", v.down_act_scale);
  lin(g.data(), n, I, down, H, y.data());
  add_down_bias(y.data(), n, H, v);
  if (inter) *inter = std::move(g);
  return y;
}

}  // namespace

std::vector<float> swiglu_forward(const float* gate, const float* up, const float* down, int64_t H, int64_t I,
                                  const float* x, int64_t n, int act_block, std::vector<float>* inter,
                                  const ExpertVariant& v) {
  return expert_mlp(linear, gate, up, down, H, I, x, n, act_block, inter, v);
}

std::vector<float> swiglu_forward_ref(const float* gate, const float* up, const float* down, int64_t H, int64_t I,
                                      const float* x, int64_t n, int act_block, std::vector<float>* inter,
                                      const ExpertVariant& v) {
  return expert_mlp(linear_ref, gate, up, down, H, I, x, n, act_block, inter, v);
}

bool DecoderModel::experts_loaded(int64_t l) const {
  MOESQ_CHECK(l >= 0 && l < spec_.num_layers, "layer ", l, " of a ", spec_.num_layers, "-layer model");
  return !spec_.is_moe_layer(l) || static_cast<int64_t>(layers_[l].experts.size()) == spec_.num_experts;
}

void DecoderModel::load_experts(int64_t l) {
  if (experts_loaded(l)) return;
  std::vector<ExpertWeights> experts(static_cast<size_t>(spec_.num_experts));
  load_experts_fn_(l, experts);
  layers_[l].experts = std::move(experts);
}

void DecoderModel::release_experts(int64_t l) {
  MOESQ_CHECK(l >= 0 && l < spec_.num_layers, "layer ", l, " of a ", spec_.num_layers, "-layer model");
  if (experts_on_demand()) std::vector<ExpertWeights>().swap(layers_[l].experts);
}

namespace {
// Expert e of layer l, which must be loaded (an on-demand model's released layer is an Error, not a read
// past the end).
const ExpertWeights& loaded_expert(const std::vector<LayerWeights>& layers, const io::ModelSpec& s, int64_t l,
                                   int64_t e) {
  const std::vector<ExpertWeights>& ex = layers.at(l).experts;
  MOESQ_CHECK(!ex.empty() || !s.is_moe_layer(l), layer_label(l, s.num_layers),
              ": the routed experts are not loaded (the model reads them on demand: load_experts(", l, ") first)");
  return ex.at(e);
}
}  // namespace

std::vector<float> DecoderModel::expert_forward(int64_t l, int64_t e, const float* x, int64_t n,
                                            const ForwardOptions& fo) const {
  const ExpertWeights& W = loaded_expert(layers_, spec_, l, e);
  try {
    return swiglu_forward(W.gate.data(), W.up.data(), W.down.data(), spec_.hidden_size, spec_.moe_intermediate_size,
                          x, n, fo.expert_act_block(), nullptr, expert_variant(spec_, W));
  } catch (const Error& err) {
    MOESQ_FAIL(layer_label(l, spec_.num_layers), " expert ", e, ": ", err.what());
  }
}

std::vector<float> DecoderModel::expert_forward_ref(int64_t l, int64_t e, const float* x, int64_t n,
                                                const ForwardOptions& fo) const {
  const ExpertWeights& W = loaded_expert(layers_, spec_, l, e);
  try {
    return swiglu_forward_ref(W.gate.data(), W.up.data(), W.down.data(), spec_.hidden_size,
                              spec_.moe_intermediate_size, x, n, fo.expert_act_block(), nullptr,
                              expert_variant(spec_, W));
  } catch (const Error& err) {
    MOESQ_FAIL(layer_label(l, spec_.num_layers), " expert ", e, ": ", err.what());
  }
}

namespace {
// Unquantized SwiGLU MLP y [n, H] = down(silu(gate x) ⊙ up x) of width I (dense layers, shared experts).
std::vector<float> plain_mlp(const ExpertWeights& W, int64_t H, int64_t I, const float* x, int64_t n) {
  std::vector<float> g(n * I), u(n * I), y(n * H);
  linear(x, n, H, W.gate.data(), I, g.data());
  linear(x, n, H, W.up.data(), I, u.data());
  for (int64_t i = 0; i < n * I; ++i) g[i] = silu_mul(g[i], u[i]);
  linear(g.data(), n, I, W.down.data(), H, y.data());
  return y;
}
}  // namespace

std::vector<float> DecoderModel::dense_mlp(int64_t l, const std::vector<float>& x, int64_t n) const {
  const int64_t H = spec_.hidden_size, I = spec_.intermediate_size;
  const ExpertWeights& W = layers_.at(l).dense_mlp;
  MOESQ_CHECK(static_cast<int64_t>(W.gate.size()) == I * H, "dense_mlp: layer ", l,
              " has no dense MLP weights");
  return plain_mlp(W, H, I, x.data(), n);
}

// Qwen2MoeSparseMoeBlock: shared = shared_expert(x) · sigmoid(x · w_gate) (the gate is [1, H]: one
// scalar per token); DeepSeek-V3 has no gate (factor 1).
std::vector<float> DecoderModel::shared_expert_forward(int64_t l, const std::vector<float>& x, int64_t n) const {
  const int64_t H = spec_.hidden_size, I = spec_.shared_expert_intermediate_size;
  const LayerWeights& L = layers_.at(l);
  if (L.shared_expert.gate.empty()) return std::vector<float>(n * H, 0.0f);
  MOESQ_CHECK(static_cast<int64_t>(x.size()) == n * H, "shared_expert_forward: x has ", x.size(),
              " values, expected n·H = ", n * H);
  std::vector<float> y = plain_mlp(L.shared_expert, H, I, x.data(), n);
  if (!L.shared_expert_gate.empty()) {
    std::vector<float> gz(n);  // [n, 1] gate logits
    linear(x.data(), n, H, L.shared_expert_gate.data(), 1, gz.data());
    for (int64_t t = 0; t < n; ++t) {
      const float g = 1.0f / (1.0f + std::exp(-gz[t]));
      for (int64_t c = 0; c < H; ++c) y[t * H + c] *= g;
    }
  }
  return y;
}

std::vector<float> DecoderModel::ffn_block(int64_t l, const std::vector<float>& x, int64_t n,
                                           const ForwardOptions& fo, Routes* routes) const {
  if (!spec_.is_moe_layer(l)) {
    if (routes) *routes = Routes{};
    return dense_mlp(l, x, n);
  }
  Routes r = route(l, x, n);
  std::vector<float> y = moe_block(l, x, r, fo);
  if (routes) *routes = std::move(r);
  return y;
}

// Gather the rows routed to each expert, one GEMM per projection per expert (in parallel), then
// combine y[t] = Σ_j w[t,j] · y_{e_j}(x_t) in ascending expert id order (see the file header).
std::vector<float> DecoderModel::moe_block(int64_t l, const std::vector<float>& x, const Routes& r,
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
  if (!layers_.at(l).shared_expert.gate.empty()) {  // routed + shared, as transformers adds them
    const std::vector<float> ys = shared_expert_forward(l, x, n);
    for (int64_t i = 0; i < n * H; ++i) y[i] += ys[i];
  }
  return y;
}

Routes DecoderModel::layer_forward(int64_t l, std::vector<float>& h, int64_t T, const ForwardOptions& fo) const {
  attention_block(l, h, T, fo);
  const std::vector<float> x = moe_input(l, h, T);
  Routes r;
  const std::vector<float> y = ffn_block(l, x, T, fo, &r);
  for (int64_t i = 0; i < T * spec_.hidden_size; ++i) h[i] += y[i];
  return r;
}

std::vector<float> DecoderModel::final_norm(const std::vector<float>& h, int64_t T) const {
  const int64_t H = spec_.hidden_size;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == T * H, "final_norm: h has ", h.size(), " values, expected T·H = ", T * H);
  std::vector<float> x(T * H);
  rmsnorm_rows(h.data(), T, H, final_norm_.data(), spec_.rms_norm_eps, x.data());
  return x;
}

std::vector<float> DecoderModel::logits(const std::vector<float>& h, int64_t T) const {
  const int64_t V = spec_.vocab_size;
  const std::vector<float> x = final_norm(h, T);
  std::vector<float> z(T * V);
  linear(x.data(), T, spec_.hidden_size, lm_head_.data(), V, z.data());
  return z;
}

std::vector<float> DecoderModel::forward(const std::vector<int32_t>& tokens, const ForwardOptions& fo,
                                     Trace* trace) const {
  const int64_t T = static_cast<int64_t>(tokens.size());
  std::vector<float> h = embed(tokens);  // [T, H]
  if (trace) {
    *trace = Trace{};
    trace->hidden.push_back(h);
  }
  for (int64_t l = 0; l < spec_.num_layers; ++l) {
    Routes r = layer_forward(l, h, T, fo);
    if (!trace) continue;
    trace->router_logits.push_back(r.logits);  // a dense layer leaves empty entries
    trace->routes.push_back(std::move(r));
    // HF's last hidden state is after the final norm
    trace->hidden.push_back(l + 1 < spec_.num_layers ? h : final_norm(h, T));
  }
  return logits(h, T);
}

double DecoderModel::window_nll(const std::vector<int32_t>& tokens, const ForwardOptions& fo,
                            int64_t* predicted) const {
  const int64_t T = static_cast<int64_t>(tokens.size()), V = spec_.vocab_size;
  MOESQ_CHECK(T >= 2, "window_nll: a window needs at least 2 tokens, got ", T);
  const std::vector<float> z = forward(tokens, fo);  // [T, V]
  if (predicted) *predicted = T - 1;
  return next_token_nll(z.data(), tokens, V);
}

}  // namespace moesq::model
