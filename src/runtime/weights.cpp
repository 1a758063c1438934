// Host weights of the GPU engine (weights.h).
#include "runtime/weights.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "io/config.h"
#include "io/config_check.h"
#include "io/config_hybrid.h"
#include "io/import_checkpoint.h"
#include "io/tensor_names.h"
#include "io/tensor_names_families.h"
#include "model/rope.h"
#include "runtime/experts/registry.h"

namespace moesq::runtime {

namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = f32_to_bf16(v[i]);
  return o;
}

// moe_only: only the MoE block must run the family (one MoE layer alone, load_host_moe_layer).
void require_supported(const io::Checkpoint& ckpt, bool moe_only = false) {
  const std::string moe = moe_block_refusal(ckpt.spec());
  const std::string why = moe_only ? (moe.empty() ? "" : "MoE block: " + moe) : gpu_refusal(ckpt.spec());
  MOESQ_CHECK(why.empty(), ckpt.dir(), ": the GPU engine does not run model_type \"", ckpt.spec().model_type,
              "\"", moe_only ? "'s MoE layers" : "", ": ", why);
  io::check_config_against_tensors(ckpt);  // the host buffers below are sized by config.json
}

// The resolved backend of the checkpoint for `requested`, and the storage it holds.
ExpertBackend resolve_for(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, ExpertBackend requested,
                          io::ExpertStorage* storage) {
  *storage = checkpoint_expert_storage(ckpt, q);
  return resolve_backend(requested, *storage);
}

}  // namespace

std::string gpu_refusal(const io::ModelSpec& spec) {
  std::string why;
  auto block = [&](const char* name, const std::string& refusal) {
    if (!refusal.empty()) why += (why.empty() ? "" : "; ") + std::string(name) + " block: " + refusal;
  };
  block("attention", spec.mla.kv_lora_rank > 0 ? mla_block_refusal(spec) : attention_block_refusal(spec));
  block("MoE", moe_block_refusal(spec));
  return why;
}

bool supports(const io::ModelSpec& spec) { return gpu_refusal(spec).empty(); }

namespace {

constexpr const char* kQwen3Next = "qwen3-next-80b-a3b";
constexpr const char* kQwen35 = "qwen3.5-397b-a17b";

// The layer kinds of a Qwen3-Next / Qwen3.5 hybrid: every fourth layer gated attention, the rest Gated
// DeltaNet.
nlohmann::json every_fourth_full_attention(int layers) {
  nlohmann::json types = nlohmann::json::array();
  for (int l = 0; l < layers; ++l) types.push_back((l + 1) % 4 == 0 ? "full_attention" : "linear_attention");
  return types;
}

// Qwen/Qwen3-Next-80B-A3B's config.json, the keys the family parser reads: 48 layers of which every
// fourth is gated attention (16 heads of 256, 2 kv heads, RoPE over a quarter of the head), the others
// Gated DeltaNet (16 key heads and 32 value heads of 128, conv 4); 512 experts of 512 top-10 and a gated
// shared expert of 512.
nlohmann::json qwen3_next_80b_config() {
  nlohmann::json j;
  j["model_type"] = "qwen3_next";
  j["vocab_size"] = 151936, j["hidden_size"] = 2048, j["num_hidden_layers"] = 48;
  j["num_attention_heads"] = 16, j["num_key_value_heads"] = 2, j["head_dim"] = 256;
  j["num_experts"] = 512, j["num_experts_per_tok"] = 10, j["moe_intermediate_size"] = 512;
  j["shared_expert_intermediate_size"] = 512, j["intermediate_size"] = 5120, j["norm_topk_prob"] = true;
  j["decoder_sparse_step"] = 1, j["mlp_only_layers"] = nlohmann::json::array();
  j["rms_norm_eps"] = 1e-6, j["max_position_embeddings"] = 262144, j["tie_word_embeddings"] = false;
  j["attention_bias"] = false, j["hidden_act"] = "silu";
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}};
  j["linear_conv_kernel_dim"] = 4, j["linear_key_head_dim"] = 128, j["linear_num_key_heads"] = 16;
  j["linear_value_head_dim"] = 128, j["linear_num_value_heads"] = 32;
  j["layer_types"] = every_fourth_full_attention(48);
  return j;
}

// Qwen/Qwen3.5-397B-A17B's text_config (model_type qwen3_5_moe_text), the keys the family parser reads:
// 60 layers, every fourth gated attention (32 heads of 256, 2 kv heads, RoPE θ 1e7 over a quarter of the
// head), the others Gated DeltaNet (16 key heads and 64 value heads of 128, conv 4); hidden 4,096; 512
// experts of 1,024 top-10 and a gated shared expert of 1,024; vocabulary 248,320. No copy of the
// config.json was at hand: the numbers are those of Megatron-LM's Qwen3.5-397B-A17B decoder config ("all
// values match the HuggingFace text_config") and agree with other public restatements of it.
nlohmann::json qwen3_5_397b_config() {
  nlohmann::json j;
  j["model_type"] = "qwen3_5_moe_text";
  j["vocab_size"] = 248320, j["hidden_size"] = 4096, j["num_hidden_layers"] = 60;
  j["num_attention_heads"] = 32, j["num_key_value_heads"] = 2, j["head_dim"] = 256;
  j["num_experts"] = 512, j["num_experts_per_tok"] = 10, j["moe_intermediate_size"] = 1024;
  j["shared_expert_intermediate_size"] = 1024;
  j["rms_norm_eps"] = 1e-6, j["max_position_embeddings"] = 262144, j["tie_word_embeddings"] = false;
  j["attention_bias"] = false, j["hidden_act"] = "silu", j["partial_rotary_factor"] = 0.25;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}};
  j["linear_conv_kernel_dim"] = 4, j["linear_key_head_dim"] = 128, j["linear_num_key_heads"] = 16;
  j["linear_value_head_dim"] = 128, j["linear_num_value_heads"] = 64;
  j["layer_types"] = every_fourth_full_attention(60);
  return j;
}

// The config.json of a named hybrid, null for the others.
nlohmann::json hybrid_config(const std::string& name) {
  if (name == kQwen3Next) return qwen3_next_80b_config();
  if (name == kQwen35) return qwen3_5_397b_config();
  return nullptr;
}

}  // namespace

bool synthetic_is_hybrid(const std::string& name) { return !hybrid_config(name).is_null(); }

HostModel synthetic_model(const std::string& name, int64_t layers) {
  HostModel m;
  m.spec = synthetic_spec(name, layers);
  m.layers.resize(m.spec.num_layers);
  if (!synthetic_is_hybrid(name)) return m;
  const io::FamilySpec f = io::parse_family_config(hybrid_config(name), std::string("--synthetic ") + name);
  m.rope = model::rope_frequencies(f.rope);
  m.gdn = gdn_block_dims(f);
  for (int64_t l = 0; l < m.spec.num_layers; ++l) {
    HostLayer& L = m.layers[l];
    L.is_gdn = f.layer_mixer.at(l) == io::MixerKind::GatedDeltaNet;
    L.attn.output_gate = !L.is_gdn && f.attn_output_gate;
    L.attn.rotary_dim = L.is_gdn ? 0 : static_cast<int>(f.rope.rotary_dim);
  }
  return m;
}

io::ModelSpec synthetic_spec(const std::string& name, int64_t layers) {
  if (synthetic_is_hybrid(name)) {
    io::ModelSpec s = io::parse_config(hybrid_config(name), std::string("--synthetic ") + name);
    MOESQ_CHECK(layers >= 0 && layers <= s.num_layers, "--layers: ", layers, " not in [0, ", s.num_layers, "]");
    if (layers > 0) s.num_layers = layers;
    return s;
  }
  io::ModelSpec s;
  s.model_type = "qwen3_moe";
  s.vocab_size = 151936, s.head_dim = 128, s.top_k = 8, s.num_experts = 128, s.norm_topk_prob = true;
  s.rms_norm_eps = 1e-6, s.rope_theta = 1000000.0, s.max_position_embeddings = 40960;
  if (name == "qwen3-30b-a3b") {
    s.hidden_size = 2048, s.num_layers = 48, s.num_heads = 32, s.num_kv_heads = 4, s.moe_intermediate_size = 768;
    s.intermediate_size = 6144;
  } else if (name == "qwen3-235b-a22b") {
    s.hidden_size = 4096, s.num_layers = 94, s.num_heads = 64, s.num_kv_heads = 4, s.moe_intermediate_size = 1536;
    s.intermediate_size = 12288;
  } else if (name == "kimi-k2.5") {
    // moonshotai/Kimi-K2.5's text model (model_type kimi_k2, the DeepSeek-V3 architecture), its public
    // config.json: MLA (64 heads, q_lora 1536, kv_lora 512, rope 64 with YaRN factor 64 over 4,096,
    // nope 128, v 128), 384 experts top-8 of width 2,048 with one shared expert, a sigmoid router with
    // correction bias scaled by 2.827, the first of 61 layers dense (18,432 wide).
    s = io::ModelSpec{};
    s.model_type = "kimi_k2";
    s.vocab_size = 163840, s.hidden_size = 7168, s.num_layers = 61, s.num_heads = 64, s.num_kv_heads = 64;
    s.head_dim = 192, s.intermediate_size = 18432, s.moe_intermediate_size = 2048, s.num_experts = 384, s.top_k = 8;
    s.norm_topk_prob = true, s.rms_norm_eps = 1e-5, s.rope_theta = 50000.0, s.max_position_embeddings = 262144;
    s.first_k_dense_replace = 1, s.qk_norm = io::QkNorm::None;
    s.router_scoring = io::RouterScoring::Sigmoid, s.router_correction_bias = true, s.n_group = 1, s.topk_group = 1;
    s.routed_scaling_factor = 2.827, s.num_shared_experts = 1, s.shared_expert_intermediate_size = 2048;
    io::MlaSpec& m = s.mla;
    m.q_lora_rank = 1536, m.kv_lora_rank = 512, m.qk_nope_head_dim = 128, m.qk_rope_head_dim = 64, m.v_head_dim = 128;
    m.rope_interleave = true;
    m.rope.type = "yarn", m.rope.theta = 50000.0, m.rope.factor = 64.0, m.rope.original_max_position_embeddings = 4096;
    m.rope.beta_fast = 1.0, m.rope.beta_slow = 1.0, m.rope.mscale = 1.0, m.rope.mscale_all_dim = 1.0;
    const double mscale = io::yarn_get_mscale(m.rope.factor, m.rope.mscale_all_dim);
    m.softmax_scale = mscale * mscale / std::sqrt(static_cast<double>(m.qk_nope_head_dim + m.qk_rope_head_dim));
  } else {
    MOESQ_FAIL("--synthetic: \"", name, "\" is not one of qwen3-30b-a3b, qwen3-235b-a22b, kimi-k2.5, ", kQwen3Next, ", ",
               kQwen35);
  }
  MOESQ_CHECK(layers >= 0 && layers <= s.num_layers, "--layers: ", layers, " not in [0, ", s.num_layers, "]");
  if (layers > 0) s.num_layers = layers;
  return s;
}

io::ExpertStorage checkpoint_expert_storage(const io::Checkpoint& ckpt, const io::QuantizationConfig& q) {
  io::check_expert_storage(ckpt, q, false);
  // A compressed-tensors config may leave some routed experts unquantized (ignored, stored dense) beside
  // packed ones; the CPU forward reads both, the engine uploads one expert format per model.
  if (q.layout != io::CheckpointLayout::Moesq && q.storage != io::ExpertStorage::Dense) {
    const io::ExpertStorageCensus c = io::census_expert_storage(ckpt, q);
    MOESQ_CHECK(c.dense == 0, ckpt.dir(), ": ", c.dense, " routed-expert projections are stored dense (modules that "
                "config.json quantization_config.ignore leaves unquantized) beside ", c.packed, " packed ones; the GPU "
                "engine runs one expert format per model (evaluate this checkpoint with --device cpu)");
  }
  if (q.storage != io::ExpertStorage::Nvfp4 || q.layout == io::CheckpointLayout::Moesq) return q.storage;
  const io::ModelSpec& s = ckpt.spec();
  int64_t l = 0;
  while (l + 1 < s.num_layers && !s.is_moe_layer(l)) ++l;
  const std::string p = io::expert_tensor_prefix(s, l, 0, io::ExpertProj::Gate);
  if (!io::has_packed_projection(ckpt, p)) return io::ExpertStorage::Nvfp4;
  return io::read_packed_weight(ckpt, q, p, s.moe_intermediate_size, s.hidden_size).is_sparse48()
             ? io::ExpertStorage::Sparse48
             : io::ExpertStorage::Nvfp4;
}

ExpertBackend resolve_backend(ExpertBackend requested, io::ExpertStorage storage) {
  ExpertBackend b = requested;
  if (b == ExpertBackend::kAuto) {
    switch (storage) {
      case io::ExpertStorage::Sparse48: b = ExpertBackend::kSparseW4A4; break;
      case io::ExpertStorage::Nvfp4: b = ExpertBackend::kNvfp4W4A16; break;
      case io::ExpertStorage::Dense:
      case io::ExpertStorage::Int4: b = ExpertBackend::kBf16; break;
    }
  }
  require_built(b);
  const std::string why = expert_backend_host(b).refuses(storage);
  MOESQ_CHECK(why.empty(), why);
  return b;
}

HostModel load_host_model(const io::Checkpoint& ckpt, ExpertBackend requested, int64_t expert_begin,
                          int64_t expert_end) {
  require_supported(ckpt);
  HostModel m;
  m.spec = ckpt.spec();
  const io::ModelSpec& s = m.spec;
  const io::QuantizationConfig q = io::read_quantization_config(ckpt);
  m.backend = resolve_for(ckpt, q, requested, &m.expert_storage);
  m.act_quant = expert_backend_host(m.backend).act_quant();
  m.act_block = expert_backend_host(m.backend).act_block();
  const int64_t H = s.hidden_size, V = s.vocab_size;
  const bool hybrid = is_hybrid_family(s.model_type);
  io::FamilySpec f;
  if (hybrid || is_sink_attention_family(s.model_type))
    f = io::parse_family_config(ckpt.config(), ckpt.dir() + "/config.json");
  m.embed = to_bf16(ckpt.get_f32(io::kEmbedTokens, {V, H}));
  // The hybrid families scale by 1 + w (zero-centred RMSNorms), folded here as the CPU loader folds it.
  auto norm = [&](const std::string& name) {
    std::vector<float> w = ckpt.get_f32(name, {H});
    if (hybrid && f.zero_centered_norms)
      for (float& v : w) v = 1.0f + v;
    return w;
  };
  m.final_norm = norm(io::kFinalNorm);
  if (ckpt.has(io::kLmHead)) {
    m.lm_head = to_bf16(ckpt.get_f32(io::kLmHead, {V, H}));
  } else {
    MOESQ_CHECK(s.tie_word_embeddings, "tensor ", io::kLmHead, " not found in ", ckpt.dir(),
                " and tie_word_embeddings is false");
    m.lm_head = m.embed;
  }
  if (is_sink_attention_family(s.model_type) || hybrid) m.rope = model::rope_frequencies(f.rope);
  if (hybrid) {
    const std::string why = gdn_block_refusal(f);
    MOESQ_CHECK(why.empty(), ckpt.dir(), ": the GPU engine's Gated DeltaNet block does not run this model: ", why);
    m.gdn = gdn_block_dims(f);
  }
  m.layers.resize(s.num_layers);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    HostLayer& L = m.layers[l];
    L.is_gdn = hybrid && f.layer_mixer.at(l) == io::MixerKind::GatedDeltaNet;
    if (s.mla.kv_lora_rank > 0)
      L.mla = load_host_mla(ckpt, l);
    else if (L.is_gdn)
      L.gdn = load_host_gdn(ckpt, f, l);
    else
      L.attn = load_host_attention(ckpt, l);
    L.post_norm = norm(io::layer_tensor(l, io::kPostNorm));
    L.moe = s.is_moe_layer(l) ? load_host_moe(ckpt, q, m.backend, l, expert_begin, expert_end)
                              : load_host_dense_layer(ckpt, l);
  }
  return m;
}

HostMoeLayer load_host_moe_layer(const io::Checkpoint& ckpt, int64_t layer, ExpertBackend requested) {
  require_supported(ckpt, true);
  HostMoeLayer m;
  m.spec = ckpt.spec();
  MOESQ_CHECK(layer >= 0 && layer < m.spec.num_layers, ckpt.dir(), ": layer ", layer, " outside [0, ",
              m.spec.num_layers, ")");
  MOESQ_CHECK(m.spec.is_moe_layer(layer), ckpt.dir(), ": layer ", layer,
              " is a dense MLP layer (mlp_only_layers / decoder_sparse_step), not a MoE layer");
  m.layer = layer;
  const io::QuantizationConfig q = io::read_quantization_config(ckpt);
  m.backend = resolve_for(ckpt, q, requested, &m.expert_storage);
  m.act_quant = expert_backend_host(m.backend).act_quant();
  m.weights = load_host_moe(ckpt, q, m.backend, layer);
  return m;
}

}  // namespace moesq::runtime
