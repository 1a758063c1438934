// gpt-oss's fused expert tensors (all experts of a layer in one [E, H, 2I] gate|up and one [E, I, H]
// down tensor, transformers GptOssExperts) unpacked into per-expert Linear layout at load; the expert
// itself is model::swiglu_forward with an ExpertVariant (biases, clamped SwiGLU).
#pragma once
#include <cstdint>
#include <vector>

#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "model/decoder.h"

namespace moesq::model {

// Expert e of the fused gpt-oss tensors (transformers GptOssExperts) → Linear layout in w.
// gate_up [E, H, 2I] with gate in the even and up in the odd columns (null: leave w.gate / w.up),
// gate_up_bias [E, 2I] interleaved likewise → w.gate [I, H], w.up [I, H], w.gate_bias, w.up_bias [I];
// down [E, I, H] (null: leave w.down) → w.down [H, I], down_bias [E, H] → w.down_bias [H].
void unpack_fused_gate_up(const float* gate_up, const float* gate_up_bias, int64_t E, int64_t H, int64_t I, int64_t e,
                          ExpertWeights& w);
void unpack_fused_down(const float* down, const float* down_bias, int64_t E, int64_t H, int64_t I, int64_t e,
                       ExpertWeights& w);

// MoE layer `layer`'s expert biases of a fused-expert family (gpt-oss) as the fused tensors lay them
// out: gate_up_bias [E, 2I] (gate in the even, up in the odd columns), down_bias [E, H] fp32 — from the
// fused bias tensors, or gathered from a compressed checkpoint's per-expert Linear biases.
void load_fused_expert_biases(const io::Checkpoint& ckpt, int64_t layer, std::vector<float>& gate_up_bias,
                              std::vector<float>& down_bias);
// MoE layer `layer`'s E routed experts as the CPU forward reads them (model/loader.cpp: fused or
// per-expert tensors, packed ones dequantized exactly, biases, static activation scales): for loaders
// outside the model (the GPU engine's expert backends for fused-expert families). Errors name the tensor
// and the directory.
std::vector<ExpertWeights> load_moe_layer_experts(const io::Checkpoint& ckpt, const io::QuantizationConfig& q,
                                                  int64_t layer);

}  // namespace moesq::model
