// Loader helpers of the family mixers (hybrid_mixer.cpp, sink_attention.cpp): one tensor of layer l
// with its shape checked (Error names tensor, shapes and directory), RMSNorm multipliers, the
// attention projections, Gated DeltaNet and gated-attention weights, and the mixer shapes a
// io::FamilySpec implies.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config_hybrid.h"
#include "model/mixers/gated_attention.h"
#include "model/mixers/gated_deltanet.h"

namespace moesq::model {

// The attention shape of layer `layer` (window on sliding layers) and the Gated DeltaNet shape of a family.
AttentionShape family_attention_shape(const io::FamilySpec& f, int64_t layer);
GdnShape family_gdn_shape(const io::FamilySpec& f);

}  // namespace moesq::model

namespace moesq::model::family_load {

std::vector<float> layer_f32(const io::Checkpoint& ckpt, int64_t l, const std::string& rest,
                             const std::vector<int64_t>& shape);
// An RMSNorm weight [n] of layer l as the multiplier the forward uses: 1 + w (zero-centred) or w.
std::vector<float> norm_multiplier(const io::Checkpoint& ckpt, int64_t l, const std::string& rest, int64_t n,
                                   bool zero_centered);
// q/k/v/o projections (+ biases when attention_bias) of layer l into w.
void load_attention_projections(const io::Checkpoint& ckpt, const io::FamilySpec& f, int64_t l, AttentionWeights& w);

// Gated DeltaNet weights of layer l (fused qwen3_next rows re-laid out by unfuse_qkvz_ba).
void load_gdn(const io::Checkpoint& ckpt, const io::FamilySpec& f, const GdnShape& g, int64_t l, GdnWeights& w);
// Gated attention of a Qwen3-Next / Qwen3.5 layer: projections + per-head q/k norm multipliers.
void load_hybrid_attention(const io::Checkpoint& ckpt, const io::FamilySpec& f, int64_t l, AttentionWeights& w);

}  // namespace moesq::model::family_load
