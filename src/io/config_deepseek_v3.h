// HF config.json → DeepseekV3Spec for the DeepSeek-V3 family (model_type `deepseek_v3`; Kimi-K2 /
// Kimi-K2.5 text models use the same architecture under `kimi_k2`).
//
// The family adds to a Qwen3-MoE layout: multi-head latent attention (q/kv LoRA ranks, decoupled RoPE
// dims), a sigmoid router with `e_score_correction_bias` and grouped top-k, a routed scaling factor,
// shared experts and `first_k_dense_replace` dense layers. Fields follow transformers'
// DeepseekV3Config; keys that set shapes or routing arithmetic are required (an Error names the key),
// keys transformers gives a documented default (norm_topk_prob = true, rope_interleave = true,
// rms_norm_eps = 1e-6, attention_bias = false, tie_word_embeddings = false) take it.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/rope_config.h"

namespace moesq::io {

struct DeepseekV3Spec {
  std::string model_type;  // "deepseek_v3" | "kimi_k2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;            // H
  int64_t intermediate_size = 0;      // dense MLP width (layers < first_k_dense_replace)
  int64_t moe_intermediate_size = 0;  // I, routed expert width (shared: I · n_shared_experts)
  int64_t num_layers = 0;
  int64_t num_heads = 0;  // nh (num_key_value_heads must equal it: MLA expands k/v per head)
  // Multi-head latent attention.
  int64_t q_lora_rank = 0;  // 0 = config's null: q_proj [nh·(nope+rope), H] instead of q_a/q_b
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // rope dims stored as interleaved pairs (transformers' default)
  RopeSpec rope;
  int64_t max_position_embeddings = 0;
  // Routing (DeepseekV3TopkRouter): sigmoid scores, + e_score_correction_bias for the choice only,
  // n_group groups, top-2 sum per group, topk_group groups kept, top-k inside them.
  int64_t n_routed_experts = 0;  // E
  int64_t n_shared_experts = 0;  // 0 = none
  int64_t top_k = 0;             // num_experts_per_tok
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  double rms_norm_eps = 1e-6;
  bool attention_bias = false;  // q_a_proj, kv_a_proj_with_mqa and o_proj carry a .bias
  bool tie_word_embeddings = false;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool is_moe_layer(int64_t layer) const { return layer >= first_k_dense_replace; }
  // qk_head_dim^-½, times mscale(factor, mscale_all_dim)² under YaRN with mscale_all_dim (as
  // transformers' DeepseekV3Attention.scaling).
  double softmax_scale() const;
};

// Throws Error naming `source` and the key for a missing/invalid key or a setting moesq does not
// implement (scoring_func other than sigmoid, topk_method other than noaux_tc, moe_layer_freq ≠ 1,
// a RoPE type other than default/yarn, num_key_value_heads ≠ num_attention_heads).
DeepseekV3Spec parse_deepseek_v3_config(const nlohmann::json& j, const std::string& source);
bool is_deepseek_v3_model_type(const std::string& model_type);

// Fills the family-independent view (ModelSpec, what the generic decoder reads) from d:
// num_experts = n_routed_experts, head_dim = qk_head_dim, sigmoid router with correction bias,
// grouped top-k, shared experts of width I · n_shared_experts, first_k_dense_replace dense layers.
void fill_model_spec(const DeepseekV3Spec& d, ModelSpec& s);

}  // namespace moesq::io
