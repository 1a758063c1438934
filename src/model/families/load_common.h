// Loader helpers of families/qwen3_next.cpp and the family mixers (mixers/): one tensor of layer
// l with its shape checked (Error names tensor, shapes and directory), RMSNorm multipliers, a
// SwiGLU triple, and the whole-model tensors (embeddings, final norm, lm_head or tied).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config_hybrid.h"
#include "model/families/family_model.h"

namespace moesq::model::family_load {

std::vector<float> layer_f32(const io::Checkpoint& ckpt, int64_t l, const std::string& rest,
                             const std::vector<int64_t>& shape);
// An RMSNorm weight [n] as the multiplier the forward uses: 1 + w (zero-centred) or w.
std::vector<float> norm_multiplier(const io::Checkpoint& ckpt, int64_t l, const std::string& rest, int64_t n,
                                   bool zero_centered);
// "{prefix}{gate,up,down}_proj.weight" under layer l: gate/up [I, H], down [H, I].
ExpertWeights swiglu_triple(const io::Checkpoint& ckpt, int64_t l, const std::string& prefix, int64_t I, int64_t H);
void load_whole_model(const io::Checkpoint& ckpt, const io::FamilySpec& f, FamilyModel& m);
// q/k/v/o projections (+ biases when attention_bias) of layer l into w.
void load_attention_projections(const io::Checkpoint& ckpt, const io::FamilySpec& f, int64_t l, AttentionWeights& w);

// Gated DeltaNet weights of layer l (fused qwen3_next rows re-laid out by unfuse_qkvz_ba).
void load_gdn(const io::Checkpoint& ckpt, const io::FamilySpec& f, const GdnShape& g, int64_t l, GdnWeights& w);
// Gated attention of a Qwen3-Next / Qwen3.5 layer: projections + per-head q/k norm multipliers.
void load_hybrid_attention(const io::Checkpoint& ckpt, const io::FamilySpec& f, int64_t l, AttentionWeights& w);

}  // namespace moesq::model::family_load
