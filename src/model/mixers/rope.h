// RoPE frequency tables for a io::RopeSpec: default RoPE and YaRN (arXiv:2309.00071 §3.2–3.4, as
// transformers' _compute_default_rope_parameters / _compute_yarn_parameters compute them, in fp32).
// The rotation itself is model/ops.h apply_rope (rotate_half convention); interleaved-pair layouts
// (deepseek_v3 `rope_interleave`) are de-interleaved first by deinterleave_pairs.
#pragma once
#include <cstdint>
#include <vector>

#include "io/rope_config.h"

namespace moesq::model {

// Inverse frequencies of the `dim` rotated dims ([dim/2], fp32) and the factor transformers applies
// to cos/sin (YaRN attention_factor; 1 for default RoPE). max_position_embeddings is the config's
// (YaRN with original_max_position_embeddings uses factor = max / original, as transformers does).
struct RopeFrequencies {
  std::vector<float> inv_freq;  // [dim/2]
  float attention_factor = 1.0f;
};
RopeFrequencies rope_frequencies(const io::RopeSpec& rope, int64_t dim, int64_t max_position_embeddings);

// cos/sin tables for positions 0..T-1: cos_t[t, i] = cos(t · inv_freq[i]) · attention_factor (the
// angle rounded to fp32 as torch's fp32 outer product does). cos_t, sin_t: [T, dim/2].
void rope_tables(int64_t T, const RopeFrequencies& f, std::vector<float>& cos_t, std::vector<float>& sin_t);

// In place on v [dim]: [v0, v1, v2, v3, …] → [v0, v2, …, v1, v3, …] (transformers'
// apply_rotary_pos_emb_interleave: view(d/2, 2).transpose), so that apply_rope then rotates the
// stored pairs (v_{2i}, v_{2i+1}) by frequency i.
void deinterleave_pairs(float* v, int64_t dim);

}  // namespace moesq::model
