// DeepSeek-V3 family: loading through io/tensor_names_deepseek_v3.h and the per-layer blocks.
// The non-obvious decisions: the shared experts are added AFTER the routed combine, unweighted and
// without activation quantization (transformers: `moe(x) + shared_experts(x)`; in a W4A4
// deployment only routed experts are NVFP4), and the router logits are an fp32 GEMM on the
// post-attention-norm rows exactly as the routed experts see them.
#include "model/families/deepseek_v3.h"

#include <cstring>
#include <string>

#include "core/error.h"
#include "io/tensor_names_deepseek_v3.h"
#include "model/mixers/linear.h"
#include "model/ops.h"
#include "model/routed_experts.h"

namespace moesq::model {

namespace names = io::deepseek_v3;

namespace {

ExpertWeights zero_swiglu(int64_t H, int64_t I) {
  ExpertWeights w;
  w.gate.assign(I * H, 0.0f);
  w.up.assign(I * H, 0.0f);
  w.down.assign(H * I, 0.0f);
  return w;
}

std::vector<float> run_swiglu(const ExpertWeights& w, int64_t H, const std::vector<float>& x, int64_t n) {
  const int64_t I = static_cast<int64_t>(w.gate.size()) / H;
  if (I == 0) return std::vector<float>(n * H, 0.0f);
  return swiglu_forward(w.gate.data(), w.up.data(), w.down.data(), H, I, x.data(), n, /*act_block=*/0);
}

}  // namespace

DeepseekV3::DeepseekV3(io::DeepseekV3Spec spec) : spec_(std::move(spec)) {
  const auto& s = spec_;
  const int64_t H = s.hidden_size, E = s.n_routed_experts, I = s.moe_intermediate_size;
  MOESQ_CHECK(H > 0 && s.vocab_size > 0 && s.num_layers > 0, "deepseek_v3 spec: hidden_size, vocab_size and "
              "num_hidden_layers must be > 0");
  embed_.assign(s.vocab_size * H, 0.0f);
  final_norm_.assign(H, 0.0f);
  lm_head_.assign(s.vocab_size * H, 0.0f);
  layers_.resize(s.num_layers);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    DeepseekV3Layer& L = layers_[l];
    L.input_norm.assign(H, 0.0f);
    L.post_norm.assign(H, 0.0f);
    L.attn = mla_zero_weights(mla_dims(), s.attention_bias);
    if (!s.is_moe_layer(l)) {
      L.dense_mlp = zero_swiglu(H, s.intermediate_size);
      continue;
    }
    L.router.assign(E * H, 0.0f);
    L.correction_bias.assign(E, 0.0f);
    L.experts.assign(E, zero_swiglu(H, I));
    if (s.n_shared_experts > 0) L.shared = zero_swiglu(H, I * s.n_shared_experts);
  }
}

DeepseekV3::DeepseekV3(const io::Checkpoint& ckpt)
    : DeepseekV3(io::parse_deepseek_v3_config(ckpt.config(), ckpt.dir() + "/config.json")) {
  load(ckpt);
}

MlaDims DeepseekV3::mla_dims() const {
  MlaDims d;
  d.hidden = spec_.hidden_size;
  d.num_heads = spec_.num_heads;
  d.q_lora_rank = spec_.q_lora_rank;
  d.kv_lora_rank = spec_.kv_lora_rank;
  d.qk_nope_head_dim = spec_.qk_nope_head_dim;
  d.qk_rope_head_dim = spec_.qk_rope_head_dim;
  d.v_head_dim = spec_.v_head_dim;
  d.rope_interleave = spec_.rope_interleave;
  d.softmax_scale = static_cast<float>(spec_.softmax_scale());
  return d;
}

GroupedTopkParams DeepseekV3::router_params() const {
  GroupedTopkParams p;
  p.num_experts = spec_.n_routed_experts;
  p.top_k = spec_.top_k;
  p.n_group = spec_.n_group;
  p.topk_group = spec_.topk_group;
  p.norm_topk_prob = spec_.norm_topk_prob;
  p.routed_scaling_factor = static_cast<float>(spec_.routed_scaling_factor);
  return p;
}

void DeepseekV3::load(const io::Checkpoint& ckpt) {
  const auto& s = spec_;
  // One weight with its expected shape; compressed or FP8 storage is refused by name.
  auto read = [&](const std::string& name, std::vector<float>& dst, const std::vector<int64_t>& shape) {
    const std::string stem = name.substr(0, name.rfind('.'));
    MOESQ_CHECK(ckpt.has(name) || !ckpt.has(stem + io::kWeightPacked), ckpt.dir(), ": tensor ", name,
                " is stored compressed (", stem, io::kWeightPacked,
                "); loading compressed deepseek_v3 checkpoints is not implemented yet");
    const io::TensorView& t = ckpt.get(name);
    MOESQ_CHECK(t.dtype != io::DType::F8_E4M3, t.file, ": tensor ", name,
                " is F8_E4M3 (an FP8 block-quantized checkpoint): moesq reads bf16/f16/f32 weights; dequantize it "
                "with its weight_scale_inv first");
    dst = ckpt.get_f32(name, shape);
  };
  const int64_t H = s.hidden_size, V = s.vocab_size, nh = s.num_heads, E = s.n_routed_experts;
  read(io::kEmbedTokens, embed_, {V, H});
  read(io::kFinalNorm, final_norm_, {H});
  if (s.tie_word_embeddings) {
    lm_head_ = embed_;  // transformers ties after loading: a stored lm_head.weight is ignored
  } else {
    MOESQ_CHECK(ckpt.has(io::kLmHead), "tensor lm_head.weight not found in ", ckpt.dir(),
                " and tie_word_embeddings is false");
    read(io::kLmHead, lm_head_, {V, H});
  }
  const MlaDims d = mla_dims();
  const int64_t dqk = d.qk_head_dim();
  for (int64_t l = 0; l < s.num_layers; ++l) {
    DeepseekV3Layer& L = layers_[l];
    auto w = [&](const char* module) { return io::layer_tensor(l, std::string(module) + io::kWeight); };
    auto b = [&](const char* module) { return io::layer_tensor(l, std::string(module) + names::kBias); };
    read(io::layer_tensor(l, names::kInputNorm), L.input_norm, {H});
    read(io::layer_tensor(l, names::kPostAttnNorm), L.post_norm, {H});
    MlaWeights& A = L.attn;
    if (s.q_lora_rank > 0) {
      read(w(names::kQAProj), A.q_a_proj, {s.q_lora_rank, H});
      read(io::layer_tensor(l, names::kQANorm), A.q_a_norm, {s.q_lora_rank});
      read(w(names::kQBProj), A.q_b_proj, {nh * dqk, s.q_lora_rank});
      if (s.attention_bias) read(b(names::kQAProj), A.q_a_bias, {s.q_lora_rank});
    } else {
      read(w(names::kQProj), A.q_proj, {nh * dqk, H});
    }
    read(w(names::kKvAProj), A.kv_a_proj, {s.kv_lora_rank + s.qk_rope_head_dim, H});
    read(io::layer_tensor(l, names::kKvANorm), A.kv_a_norm, {s.kv_lora_rank});
    read(w(names::kKvBProj), A.kv_b_proj, {nh * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank});
    read(w(names::kOProj), A.o_proj, {H, nh * s.v_head_dim});
    if (s.attention_bias) {
      read(b(names::kKvAProj), A.kv_a_bias, {s.kv_lora_rank + s.qk_rope_head_dim});
      read(b(names::kOProj), A.o_bias, {H});
    }
    auto read_swiglu = [&](const char* module, ExpertWeights& W, int64_t I) {
      read(names::swiglu_weight(l, module, io::ExpertProj::Gate), W.gate, {I, H});
      read(names::swiglu_weight(l, module, io::ExpertProj::Up), W.up, {I, H});
      read(names::swiglu_weight(l, module, io::ExpertProj::Down), W.down, {H, I});
    };
    if (!s.is_moe_layer(l)) {
      read_swiglu(names::kDenseMlp, L.dense_mlp, s.intermediate_size);
      continue;
    }
    read(io::layer_tensor(l, names::kRouter), L.router, {E, H});
    // transformers registers the bias as a buffer initialised to zeros: a checkpoint without it
    // routes on the plain sigmoid scores.
    const std::string bias = io::layer_tensor(l, names::kRouterBias);
    if (ckpt.has(bias)) read(bias, L.correction_bias, {E});
    for (int64_t e = 0; e < E; ++e) {
      ExpertWeights& W = L.experts[e];
      const int64_t I = s.moe_intermediate_size;
      read(io::expert_tensor_prefix(l, e, io::ExpertProj::Gate) + io::kWeight, W.gate, {I, H});
      read(io::expert_tensor_prefix(l, e, io::ExpertProj::Up) + io::kWeight, W.up, {I, H});
      read(io::expert_tensor_prefix(l, e, io::ExpertProj::Down) + io::kWeight, W.down, {H, I});
    }
    if (s.n_shared_experts > 0) read_swiglu(names::kSharedExperts, L.shared, s.moe_intermediate_size * s.n_shared_experts);
  }
}

std::vector<float> DeepseekV3::embed(const std::vector<int32_t>& tokens) const {
  const int64_t H = spec_.hidden_size;
  std::vector<float> h(tokens.size() * H);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t id = tokens[t];
    MOESQ_CHECK(id >= 0 && id < spec_.vocab_size, "token id ", id, " at position ", t, " is outside the vocabulary [0, ",
                spec_.vocab_size, ")");
    std::memcpy(&h[t * H], &embed_[static_cast<int64_t>(id) * H], H * sizeof(float));
  }
  return h;
}

RopeTables DeepseekV3::rope_tables(int64_t T) const {
  const RopeFrequencies f = rope_frequencies(spec_.rope, spec_.qk_rope_head_dim, spec_.max_position_embeddings);
  RopeTables r;
  model::rope_tables(T, f, r.cos, r.sin);
  return r;
}

void DeepseekV3::attention_block(int64_t l, std::vector<float>& h, int64_t T, const RopeTables& rope,
                                 const ForwardOptions& fo) const {
  const int64_t H = spec_.hidden_size;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == T * H, "attention_block: h has ", h.size(), " values, expected T·H = ",
              T * H);
  std::vector<float> x(T * H), o(T * H);  // [T, H]
  rmsnorm_rows(h.data(), T, H, layer(l).input_norm.data(), spec_.rms_norm_eps, x.data());
  try {
    mla_forward(mla_dims(), layer(l).attn, rope, x.data(), T, o.data(), fo.threads);
  } catch (const Error& e) {
    MOESQ_FAIL("layer ", l, " attention: ", e.what());
  }
  for (int64_t i = 0; i < T * H; ++i) h[i] += o[i];
}

void DeepseekV3::attention_block_ref(int64_t l, std::vector<float>& h, int64_t T, const RopeTables& rope) const {
  const int64_t H = spec_.hidden_size;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == T * H, "attention_block_ref: h has ", h.size(),
              " values, expected T·H = ", T * H);
  std::vector<float> x(T * H), o(T * H);
  rmsnorm_rows(h.data(), T, H, layer(l).input_norm.data(), spec_.rms_norm_eps, x.data());
  mla_forward_ref(mla_dims(), layer(l).attn, rope, x.data(), T, o.data());
  for (int64_t i = 0; i < T * H; ++i) h[i] += o[i];
}

std::vector<float> DeepseekV3::moe_input(int64_t l, const std::vector<float>& h, int64_t n) const {
  const int64_t H = spec_.hidden_size;
  MOESQ_CHECK(static_cast<int64_t>(h.size()) == n * H, "moe_input: h has ", h.size(), " values, expected n·H = ", n * H);
  std::vector<float> x(n * H);
  rmsnorm_rows(h.data(), n, H, layer(l).post_norm.data(), spec_.rms_norm_eps, x.data());
  return x;
}

Routes DeepseekV3::route(int64_t l, const std::vector<float>& x, int64_t n) const {
  MOESQ_CHECK(spec_.is_moe_layer(l), "route: layer ", l, " is a dense MLP layer (first_k_dense_replace = ",
              spec_.first_k_dense_replace, ")");
  std::vector<float> z(n * spec_.n_routed_experts);  // [n, E]
  linear(x.data(), n, spec_.hidden_size, layer(l).router, spec_.n_routed_experts, z.data());
  return sigmoid_grouped_topk(router_params(), z.data(), n, layer(l).correction_bias);
}

Routes DeepseekV3::route_ref(int64_t l, const std::vector<float>& x, int64_t n) const {
  MOESQ_CHECK(spec_.is_moe_layer(l), "route_ref: layer ", l, " is a dense MLP layer");
  std::vector<float> z(n * spec_.n_routed_experts);
  linear_ref(x.data(), n, spec_.hidden_size, layer(l).router, spec_.n_routed_experts, z.data());
  return sigmoid_grouped_topk_ref(router_params(), z.data(), n, layer(l).correction_bias);
}

std::vector<float> DeepseekV3::shared_experts(int64_t l, const std::vector<float>& x, int64_t n) const {
  return run_swiglu(layer(l).shared, spec_.hidden_size, x, n);
}

std::vector<float> DeepseekV3::moe_block(int64_t l, const std::vector<float>& x, const Routes& r,
                                         const ForwardOptions& fo) const {
  std::vector<float> y =
      routed_experts_forward(layer(l).experts, spec_.hidden_size, spec_.moe_intermediate_size, x, r, fo, l);
  const std::vector<float> s = shared_experts(l, x, r.n);
  for (size_t i = 0; i < y.size(); ++i) y[i] += s[i];
  return y;
}

std::vector<float> DeepseekV3::moe_block_ref(int64_t l, const std::vector<float>& x, const Routes& r,
                                             const ForwardOptions& fo) const {
  std::vector<float> y =
      routed_experts_forward_ref(layer(l).experts, spec_.hidden_size, spec_.moe_intermediate_size, x, r, fo, l);
  const std::vector<float> s = shared_experts(l, x, r.n);
  for (size_t i = 0; i < y.size(); ++i) y[i] += s[i];
  return y;
}

std::vector<float> DeepseekV3::dense_mlp(int64_t l, const std::vector<float>& x, int64_t n) const {
  MOESQ_CHECK(!spec_.is_moe_layer(l), "dense_mlp: layer ", l, " is a MoE layer");
  return run_swiglu(layer(l).dense_mlp, spec_.hidden_size, x, n);
}

void DeepseekV3::ffn_block(int64_t l, std::vector<float>& h, int64_t T, const ForwardOptions& fo, Routes* routes) const {
  const std::vector<float> x = moe_input(l, h, T);
  std::vector<float> y;
  if (spec_.is_moe_layer(l)) {
    Routes r = route(l, x, T);
    y = moe_block(l, x, r, fo);
    if (routes) *routes = std::move(r);
  } else {
    y = dense_mlp(l, x, T);
    if (routes) *routes = Routes{};
  }
  for (size_t i = 0; i < y.size(); ++i) h[i] += y[i];
}

std::vector<float> DeepseekV3::final_norm(const std::vector<float>& h, int64_t T) const {
  std::vector<float> x(T * spec_.hidden_size);
  rmsnorm_rows(h.data(), T, spec_.hidden_size, final_norm_.data(), spec_.rms_norm_eps, x.data());
  return x;
}

std::vector<float> DeepseekV3::logits(const std::vector<float>& h, int64_t T) const {
  const std::vector<float> x = final_norm(h, T);
  std::vector<float> z(T * spec_.vocab_size);
  linear(x.data(), T, spec_.hidden_size, lm_head_, spec_.vocab_size, z.data());
  return z;
}

}  // namespace moesq::model
