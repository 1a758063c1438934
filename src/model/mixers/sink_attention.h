// The token mixer of gpt-oss (gpt_oss) as model::Mixer for the generic decoder: GQA attention with
// q/k/v/o biases, one learned sink logit per head in every softmax (its probability dropped), a
// sliding window on the sliding_attention layers of layer_types and full causal attention on the
// others, YaRN RoPE (transformers GptOssAttention; the math is mixers/gated_attention.h's). Its
// decode state (model::KvDecoder) is the attention mixer's K/V cache (mixers/hybrid_mixer.cpp), the
// RoPE taken at each step's position and, on window layers, the keys no later query sees dropped.
#pragma once
#include <memory>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/mixer.h"

namespace moesq::model {

// Reads layer `layer`'s self_attn.{q,k,v,o}_proj.{weight,bias} and self_attn.sinks [nh]; errors name
// the tensor and the directory.
std::unique_ptr<Mixer> make_sink_attention_mixer(const io::Checkpoint& ckpt, const io::ModelSpec& spec, int64_t layer);

}  // namespace moesq::model
