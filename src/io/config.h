// HF config.json → ModelSpec, per architecture family (model_type): the registry of families whose
// configs moesq reads is io/config_families.cpp. A ModelSpec describes a generic decoder of layers
// (mixer, router + routed experts [+ gated shared expert], or a dense MLP); the per-family facts
// (router scoring, q/k norm span, biases, shared experts) are DATA here, read by model/.
// Accepts both key spellings found in the wild (DESIGN.md §7): `num_experts` (hub) or
// `num_local_experts` (newer transformers), `rope_theta` or `rope_parameters.rope_theta`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/rope_config.h"

namespace moesq::io {

// Where the attention's q/k RMSNorm acts (after the projections, before RoPE).
enum class QkNorm {
  None,     // no q/k norm (Qwen2-MoE, Mixtral)
  PerHead,  // one [head_dim] weight shared by every head (Qwen3-MoE)
  Whole,    // over the whole projection: q [nh·hd], k [nkv·hd] (OLMoE)
};

// How router logits become routing scores (before top-k).
enum class RouterScoring {
  Softmax,  // p = softmax(logits) in fp32 (Qwen, Mixtral, OLMoE)
  Sigmoid,  // p = sigmoid(logits) (DeepSeek-V3); selection may add e_score_correction_bias
  TopkSoftmax,  // top-k of the logits, weights = softmax over those k logits (gpt-oss GptOssTopKRouter)
};

// Multi-head latent attention (DeepSeek-V3 / Kimi-K2: io/config_deepseek_v3.h keeps the full parse):
// the dims and RoPE the GPU engine's MLA block needs. kv_lora_rank == 0: the family has no MLA.
struct MlaSpec {
  int64_t q_lora_rank = 0;   // 0: q_proj instead of q_a_proj / q_b_proj
  int64_t kv_lora_rank = 0;  // r_kv, the latent width
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // rope dims stored as interleaved pairs
  RopeSpec rope;                // default RoPE or YaRN over the qk_rope_head_dim dims
  double softmax_scale = 1.0;   // (nope + rope)^-½ × YaRN mscale²
};

struct ModelSpec {
  std::string model_type;  // a family registered in io/config_families.cpp, e.g. "qwen3_moe"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;            // H
  int64_t intermediate_size = 0;      // dense MLP width (mlp_only_layers)
  int64_t moe_intermediate_size = 0;  // I, expert width
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t num_experts = 0;  // E
  int64_t top_k = 0;        // k
  bool norm_topk_prob = true;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 0;  // longest trained context; 0 = not given (no check)
  bool tie_word_embeddings = false;   // true: lm_head IS embed_tokens (an lm_head.weight is ignored)
  bool attention_bias = false;        // true: q/k/v/o_proj carry a .bias [N]: y = x Wᵀ + b
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t first_k_dense_replace = 0;  // layers [0, k) are dense MLP layers (DeepSeek-V3)

  // Attention details that differ between families (defaults = Qwen3-MoE).
  QkNorm qk_norm = QkNorm::PerHead;
  bool qkv_bias = false;  // q/k/v_proj (not o_proj) carry a .bias (Qwen2-MoE); attention_bias implies it

  // Router (model/router.h implements these semantics).
  RouterScoring router_scoring = RouterScoring::Softmax;
  bool router_correction_bias = false;  // selection uses p + e_score_correction_bias [E]; weights use p
  int64_t n_group = 1, topk_group = 1;  // grouped top-k: keep the topk_group best of n_group groups
  double routed_scaling_factor = 1.0;   // routed weights × this (after any renormalisation)
  bool router_logit_bias = false;       // router logits = x Wᵀ + b, b [E] (gpt-oss "mlp.router.bias")

  // Routed experts beyond plain SwiGLU (gpt-oss GptOssExperts): gate/up/down carry biases and the
  // activation is the clamped SwiGLU h = (clamp(u, ±limit) + 1) · g' · σ(alpha · g'), g' = min(g, limit)
  // (core/swiglu.h clamped_swiglu). Stored fused in the source (io/tensor_names.h kFusedExperts).
  bool expert_bias = false;
  bool clamped_swiglu = false;
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;

  // Shared experts: SwiGLU MLPs every token runs beside the routed ones (not compressed).
  int64_t num_shared_experts = 0;               // 0 = none; > 1 = one MLP num_shared_experts× wider
  int64_t shared_expert_intermediate_size = 0;  // width of the (merged) shared MLP
  bool shared_expert_gate = false;              // output × sigmoid(x · w_gate), w_gate [1, H] (Qwen2-MoE)

  // Zero-centred RMSNorms (Qwen3-Next / Qwen3.5): input, post-attention and final norm weights are
  // stored as w and applied as (1 + w); the loader folds the 1 in.
  bool rms_norm_unit_offset = false;

  // Sliding-window attention of the built-in GQA attention, per layer (transformers' sliding-window
  // causal mask: the query at position t sees keys j with t − window < j ≤ t). Empty = full causal
  // attention on every layer; set from use_sliding_window / sliding_window / layer_types (qwen3_moe,
  // qwen2_moe, io/config_families.cpp). The family mixers carry their own (io::FamilySpec).
  std::vector<int64_t> attention_window;  // [num_layers] > 0: window; 0: full causal

  MlaSpec mla;  // deepseek_v3 / kimi_k2 only

  bool is_moe_layer(int64_t layer) const;
  // attention_window[layer], 0 when none.
  int64_t window_of(int64_t layer) const;
  bool has_sliding_window() const;
  // Error naming `flag` when a sequence of `len` tokens exceeds max_position_embeddings (RoPE
  // positions the model never saw: the numbers would be meaningless).
  void check_seq_len(int64_t len, const char* flag) const;
};

// Upper bounds on counts config.json gives, checked at parse (Error naming the key): the spec's per-layer
// and per-expert tables and loops are sized by them before any tensor is read. Far above any released
// model (DeepSeek-V3: 61 layers, 256 experts), far below sizes that exhaust memory or time.
inline constexpr int64_t kMaxConfigLayers = int64_t{1} << 16;
inline constexpr int64_t kMaxConfigExperts = int64_t{1} << 20;

// Throws Error naming `source` and the key for unknown architectures or missing/invalid keys.
ModelSpec parse_config(const nlohmann::json& j, const std::string& source);
ModelSpec load_config(const std::string& config_json_path);

}  // namespace moesq::io
