// The built-in token mixer: grouped-query attention with RoPE, as in Qwen3-MoE, Qwen2-MoE, Mixtral and
// OLMoE. What differs between them is data in io::ModelSpec: where the q/k RMSNorm acts (qk_norm:
// per head, over the whole projection, or none) and which projections carry biases (the LayerWeights
// bias vectors are empty when absent).
#pragma once
#include <cstdint>
#include <vector>

#include "io/config.h"
#include "model/decoder.h"

namespace moesq::model {

// x [T, H] = input_layernorm(h) of one causal sequence → o_proj(attention) [T, H]. GQA: query head i
// reads kv head i / (nh / nkv); q/k norm before RoPE; scores · hd^-½; fp32 softmax. Parallel over heads
// (at most fo.threads, 0 = moesq::num_threads()); fo.rope_bf16_inv_freq selects the RoPE frequencies.
// L.attention_window > 0: query t sees only keys j with t − j < window (sliding-window layers).
std::vector<float> gqa_attention(const io::ModelSpec& s, const LayerWeights& L, const float* x, int64_t T,
                                 const ForwardOptions& fo);
// Plain-loop twin (no BLAS, no blocking): the oracle of gqa_attention.
std::vector<float> gqa_attention_ref(const io::ModelSpec& s, const LayerWeights& L, const float* x, int64_t T,
                                     const ForwardOptions& fo);

}  // namespace moesq::model
