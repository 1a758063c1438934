// Mixer tensor names of the qwen3_next / qwen3_5_moe_text / gpt_oss checkpoints (Hugging Face layout),
// relative to "model.layers.{l}." (io::layer_tensor builds the full name). Whole-model names and the
// MoE block's (router, experts, shared expert, fused experts: the per-family table) are io/tensor_names.h's.
#pragma once

namespace moesq::io::family_names {

// Full / sliding attention ("self_attn.").
inline constexpr const char* kAttn = "self_attn.";
inline constexpr const char* kQProj = "q_proj";  // + .weight [nh·hd·(1 + gate), H], .bias
inline constexpr const char* kKProj = "k_proj";
inline constexpr const char* kVProj = "v_proj";
inline constexpr const char* kOProj = "o_proj";
inline constexpr const char* kQNorm = "self_attn.q_norm.weight";  // [hd]
inline constexpr const char* kKNorm = "self_attn.k_norm.weight";  // [hd]
inline constexpr const char* kSinks = "self_attn.sinks";          // [nh] (gpt_oss)

// Gated DeltaNet ("linear_attn.").
inline constexpr const char* kGdnQkv = "linear_attn.in_proj_qkv.weight";    // [2·Kd + Vd, H] (qwen3_5)
inline constexpr const char* kGdnZ = "linear_attn.in_proj_z.weight";        // [Vd, H] (qwen3_5)
inline constexpr const char* kGdnB = "linear_attn.in_proj_b.weight";        // [nv, H] (qwen3_5)
inline constexpr const char* kGdnA = "linear_attn.in_proj_a.weight";        // [nv, H] (qwen3_5)
inline constexpr const char* kGdnQkvz = "linear_attn.in_proj_qkvz.weight";  // [2·Kd + 2·Vd, H] (qwen3_next)
inline constexpr const char* kGdnBa = "linear_attn.in_proj_ba.weight";      // [2·nv, H] (qwen3_next)
inline constexpr const char* kGdnConv = "linear_attn.conv1d.weight";        // [2·Kd + Vd, 1, Kc]
inline constexpr const char* kGdnDtBias = "linear_attn.dt_bias";            // [nv]
inline constexpr const char* kGdnALog = "linear_attn.A_log";                // [nv]
inline constexpr const char* kGdnNorm = "linear_attn.norm.weight";          // [dv]
inline constexpr const char* kGdnOut = "linear_attn.out_proj.weight";       // [H, Vd]

}  // namespace moesq::io::family_names
