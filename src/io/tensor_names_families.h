// Tensor names of the qwen3_next / qwen3_5_moe_text / gpt_oss checkpoints (Hugging Face layout),
// relative to "model.layers.{l}." (io::layer_tensor builds the full name). Whole-model names
// (embed_tokens, norm, lm_head) are those of io/tensor_names.h.
#pragma once

namespace moesq::io::family_names {

// Norms around the mixer and the MLP.
inline constexpr const char* kInputNorm = "input_layernorm.weight";        // [H]
inline constexpr const char* kPostNorm = "post_attention_layernorm.weight";  // [H]

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

// MoE block ("mlp."). Per-expert SwiGLU experts use io::expert_tensor_prefix.
inline constexpr const char* kRouter = "mlp.gate.weight";                          // [E, H] (Qwen)
inline constexpr const char* kSharedExpert = "mlp.shared_expert.";                 // + {gate,up,down}_proj.weight
inline constexpr const char* kSharedExpertGate = "mlp.shared_expert_gate.weight";  // [1, H]
inline constexpr const char* kDenseMlp = "mlp.";                                   // + {gate,up,down}_proj.weight
inline constexpr const char* kGptOssRouter = "mlp.router.weight";                  // [E, H]
inline constexpr const char* kGptOssRouterBias = "mlp.router.bias";                // [E]
inline constexpr const char* kFusedGateUp = "mlp.experts.gate_up_proj";            // [E, H, 2I] interleaved (gpt_oss)
inline constexpr const char* kFusedGateUpBias = "mlp.experts.gate_up_proj_bias";   // [E, 2I]
inline constexpr const char* kFusedDown = "mlp.experts.down_proj";                 // [E, I, H] (gpt_oss)
inline constexpr const char* kFusedDownBias = "mlp.experts.down_proj_bias";        // [E, H]

}  // namespace moesq::io::family_names
