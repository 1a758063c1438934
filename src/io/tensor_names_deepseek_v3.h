// The DeepSeek-V3 / Kimi-K2 tensor-name table (transformers' DeepseekV3ForCausalLM layout). Whole-model
// names (embed, final norm, lm_head) and routed-expert names (model.layers.L.mlp.experts.E.{gate,up,
// down}_proj) are the Qwen3-MoE ones of io/tensor_names.h; this table adds MLA, the sigmoid router
// and the shared experts. Shared experts live under `mlp.shared_experts.`, outside the routed-expert
// container (".mlp.experts."), so the compression pipeline never takes them for routed experts.
#pragma once
#include <cstdint>
#include <string>

#include "io/tensor_names.h"

namespace moesq::io::deepseek_v3 {

// Per-layer tensors, relative to "model.layers.{l}." (pass to layer_tensor). Shapes for H, nh,
// r_q = q_lora_rank, r_kv = kv_lora_rank, d_qk = nope + rope, E, I, I_s = I · n_shared_experts.
inline constexpr const char* kInputNorm = "input_layernorm.weight";            // [H]
inline constexpr const char* kPostAttnNorm = "post_attention_layernorm.weight";  // [H]
inline constexpr const char* kQProj = "self_attn.q_proj";                      // [nh·d_qk, H] (no q LoRA)
inline constexpr const char* kQAProj = "self_attn.q_a_proj";                   // [r_q, H]
inline constexpr const char* kQANorm = "self_attn.q_a_layernorm.weight";       // [r_q]
inline constexpr const char* kQBProj = "self_attn.q_b_proj";                   // [nh·d_qk, r_q]
inline constexpr const char* kKvAProj = "self_attn.kv_a_proj_with_mqa";        // [r_kv + rope, H]
inline constexpr const char* kKvANorm = "self_attn.kv_a_layernorm.weight";     // [r_kv]
inline constexpr const char* kKvBProj = "self_attn.kv_b_proj";                 // [nh·(nope + v), r_kv]
inline constexpr const char* kOProj = "self_attn.o_proj";                      // [H, nh·v]
inline constexpr const char* kRouter = "mlp.gate.weight";                      // [E, H]
inline constexpr const char* kRouterBias = "mlp.gate.e_score_correction_bias";  // [E] (selection only)
inline constexpr const char* kSharedExperts = "mlp.shared_experts";            // .{gate,up,down}_proj
inline constexpr const char* kDenseMlp = "mlp";                                // .{gate,up,down}_proj
// attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj also carry "{module}.bias".
inline constexpr const char* kBias = ".bias";

// "model.layers.{l}.{module}.{proj}.weight" for a SwiGLU block (`module` = kSharedExperts or
// kDenseMlp; proj one of kExpertProjNames).
std::string swiglu_weight(int64_t layer, const char* module, ExpertProj proj);

}  // namespace moesq::io::deepseek_v3
