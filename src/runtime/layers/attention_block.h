// The attention block of one decoder layer on the GPU, host side: which families it runs and one
// layer's weights read through io's names. The block (attention_block_device.cuh) is
// h += o_proj(attention(q/k norm + RoPE(q|k|v(rmsnorm(h)) + bias))): the GQA attention of Qwen3-MoE,
// Qwen2-MoE (q/k/v biases, no q/k norm), Mixtral (no q/k norm) and OLMoE (whole-projection q/k norm).
//
// Non-obvious decision: q|k|v are fused into one [(nh + 2·nkv)·hd, H] projection (one GEMM, one
// head-norm/RoPE pass).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace moesq::runtime {

// Why the attention block cannot run `spec`'s family ("" when it can): the family's token mixer must be
// the built-in GQA attention (model/families.h) — q/k RMSNorm per head, over the whole projection or
// none; q/k/v biases or none, no o_proj bias; plain (not zero-centred) RMSNorm weights; full or
// sliding-window attention per layer — or gpt-oss's sink attention (model/mixers/sink_attention.h:
// q/k/v/o biases, one sink logit per head, sliding and full layers, YaRN RoPE over the whole head);
// head_dim 32, 64, 128 or 256 with 1, 2, 4, 8 or 16 query heads per kv head — or, in Qwen3-Next / Qwen3.5
// (is_hybrid_family), the gated attention of their full_attention layers (model/mixers/gated_attention.h:
// the [query | gate] q heads, zero-centred per-head q/k norms, partial RoPE), whose linear_attention
// layers are the Gated DeltaNet block's (layers/gdn_block.h).
std::string attention_block_refusal(const io::ModelSpec& spec);
// Whether model_type's layers are gpt-oss's sink attention (read through io::FamilySpec, not ModelSpec).
bool is_sink_attention_family(const std::string& model_type);
// Whether model_type is a hybrid of Gated DeltaNet and gated attention layers (qwen3_next, qwen3_5_moe_text).
bool is_hybrid_family(const std::string& model_type);

struct HostAttention {
  std::vector<float> input_norm;  // [H]
  std::vector<float> q_norm, k_norm;  // [hd] per head, [nh·hd] / [nkv·hd] whole-projection, or empty (none)
  std::vector<float> qkv_bias;    // [(nh + 2·nkv)·hd] q, k, v biases (Qwen2-MoE), or empty
  std::vector<uint16_t> qkv;      // [(nh + 2·nkv)·hd, H] bf16: q rows, then k rows, then v rows
  std::vector<uint16_t> o;        // [H, nh·hd] bf16
  std::vector<float> o_bias;      // [H] o_proj bias (gpt-oss), or empty
  std::vector<float> sinks;       // [nh] attention sink logits (gpt-oss), or empty
  int64_t window = 0;             // > 0: the layer's sliding window (ops::AttentionArgs::window); 0: full
  bool output_gate = false;       // q rows are [nh, 2·hd] = (query | gate) per head (QkRopeArgs::q_gate)
  int rotary_dim = 0;             // leading dims of a head that rotate (QkRopeArgs::rot); 0: all
};
// Layer `layer`'s input norm and attention weights. Errors name the tensor and the directory.
HostAttention load_host_attention(const io::Checkpoint& ckpt, int64_t layer);

}  // namespace moesq::runtime
