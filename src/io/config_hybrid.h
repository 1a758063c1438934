// HF config.json → FamilySpec for the hybrid and sink-attention families beside qwen3_moe:
// `qwen3_next` (Qwen3-Next), `qwen3_5_moe_text` (the text model of Qwen3.5-MoE) and `gpt_oss`.
// FamilySpec = the common ModelSpec (what compress/eval/inspect read) plus what the mixers, the
// routers and the experts of these families need. Keys that set shapes are required (an Error names
// the key and the file); keys with a transformers default take that default; a value the forward
// does not implement (an unknown layer type, a RoPE type other than default/yarn) is refused by name.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"

namespace moesq::io {

enum class HybridRopeType { Default, Yarn };

// RoPE of one attention layer (transformers modeling_rope_utils: default and YaRN).
struct HybridRopeSpec {
  HybridRopeType type = HybridRopeType::Default;
  double theta = 10000.0;
  int64_t rotary_dim = 0;  // leading dims of each head that rotate: int(head_dim · partial_rotary_factor), even
  // YaRN (Peng et al. 2023, §3): scale s, ramp bounds β_fast/β_slow over the original context.
  double factor = 1.0;
  double beta_fast = 32.0, beta_slow = 1.0;
  int64_t original_max_position_embeddings = 0;
  bool truncate = true;           // floor/ceil the correction range (transformers' default)
  double attention_factor = 1.0;  // cos/sin multiplier: YaRN's 0.1·ln(s) + 1 unless the config gives one
  // Round inv_freq to bf16 before use. Not a config key: it reproduces a transformers model that was
  // cast to bf16 and back (.to(bfloat16) … .float()), which rounds the non-persistent inv_freq buffer —
  // how the fixtures' reference forwards were produced (per call: model::ForwardOptions::rope_bf16_inv_freq). Off = exact fp32.
  bool inv_freq_bf16 = false;
};

enum class MixerKind { FullAttention, SlidingAttention, GatedDeltaNet };
const char* mixer_kind_name(MixerKind k);  // "full_attention", "sliding_attention", "linear_attention"

struct FamilySpec {
  ModelSpec base;                     // model_type, sizes, experts, top-k, eps, tie, max positions
  std::vector<MixerKind> layer_mixer;  // [L] from layer_types
  HybridRopeSpec rope;
  // Attention variants.
  bool attn_output_gate = false;  // q_proj rows are [nh, 2·hd] = (query | gate) per head; out ⊙ σ(gate)
  bool qk_norm = false;           // per-head RMSNorm of q and k before RoPE
  bool attn_sinks = false;        // one learned sink logit per head joins each softmax (gpt_oss)
  int64_t sliding_window = 0;     // sliding_attention layers: key j visible from query t iff t − j < window
  // RMSNorms (input, post-attention, final, q/k) scale by (1 + w) instead of w (Qwen3-Next/3.5).
  bool zero_centered_norms = false;
  // Gated DeltaNet (linear_attention layers).
  int64_t linear_conv_kernel = 0;
  int64_t linear_num_key_heads = 0, linear_key_head_dim = 0;
  int64_t linear_num_value_heads = 0, linear_value_head_dim = 0;
  bool fused_qkvz = false;  // qwen3_next stores in_proj_qkvz / in_proj_ba (per key-head groups)
  // Experts.
  int64_t shared_expert_intermediate_size = 0;  // 0 = no shared expert
  bool router_bias = false;                     // gpt_oss: logits = x Wᵀ + b, softmax over the top-k logits
  bool clamped_swiglu = false;                  // gpt_oss experts (alpha, limit; biases; fused interleaved)
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
};

// model_type values parse_family_config accepts.
bool is_family_model_type(const std::string& model_type);
// Error naming `source` and the key for missing/invalid keys or unsupported values.
FamilySpec parse_family_config(const nlohmann::json& j, const std::string& source);

}  // namespace moesq::io
