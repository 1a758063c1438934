// The multi-head latent attention tensors of the DeepSeek-V3 / Kimi-K2 family (transformers'
// DeepseekV3Attention), per layer under "model.layers.{l}." (pass to layer_tensor, append kWeight or
// kBias). The rest of the family's names — router + e_score_correction_bias, routed experts, shared
// experts "mlp.shared_experts", dense MLP — are its row of io/tensor_names.cpp (LayerTensorNames).
// Shapes for H, nh, r_q = q_lora_rank, r_kv = kv_lora_rank, d_qk = nope + rope.
#pragma once

namespace moesq::io::deepseek_v3 {

inline constexpr const char* kQProj = "self_attn.q_proj";                   // [nh·d_qk, H] (no q LoRA)
inline constexpr const char* kQAProj = "self_attn.q_a_proj";                // [r_q, H] (+ bias [r_q])
inline constexpr const char* kQANorm = "self_attn.q_a_layernorm";           // [r_q]
inline constexpr const char* kQBProj = "self_attn.q_b_proj";                // [nh·d_qk, r_q]
inline constexpr const char* kKvAProj = "self_attn.kv_a_proj_with_mqa";     // [r_kv + rope, H] (+ bias)
inline constexpr const char* kKvANorm = "self_attn.kv_a_layernorm";         // [r_kv]
inline constexpr const char* kKvBProj = "self_attn.kv_b_proj";              // [nh·(nope + v), r_kv]
inline constexpr const char* kOProj = "self_attn.o_proj";                   // [H, nh·v] (+ bias [H])
// attention_bias: q_a_proj, kv_a_proj_with_mqa and o_proj also carry "{module}.bias".
inline constexpr const char* kBias = ".bias";

}  // namespace moesq::io::deepseek_v3
