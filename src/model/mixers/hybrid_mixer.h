// The token mixers of Qwen3-Next (qwen3_next) and Qwen3.5 text (qwen3_5_moe_text) as
// model::Mixer for the generic decoder: Gated DeltaNet on linear_attention layers
// (mixers/gated_deltanet.h), gated partial-RoPE attention with zero-centred per-head q/k norms on
// full_attention layers (mixers/gated_attention.h). The factory reads layer `layer`'s weights.
#pragma once
#include <memory>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/mixer.h"
#include "model/mixers/gated_attention.h"

namespace moesq::model {

// The family attention of mixers/gated_attention.h (output gate, q/k norms, sinks, sliding window,
// YaRN as `s` and `w` say) as a Mixer named `name`; RoPE frequencies follow fo.rope_bf16_inv_freq.
std::unique_ptr<Mixer> make_attention_mixer(AttentionShape s, AttentionWeights w, std::string name);

std::unique_ptr<Mixer> make_hybrid_mixer(const io::Checkpoint& ckpt, const io::ModelSpec& spec, int64_t layer);

}  // namespace moesq::model
