// RoPE, the one module every mixer and the GPU engine use: inverse frequencies for default RoPE and
// YaRN (arXiv:2309.00071 §3.2–3.4, as transformers' _compute_default_rope_parameters /
// _compute_yarn_parameters compute them, in fp32), cos/sin tables, and the rotation (rotate_half
// convention). Two config forms feed it: io::RopeSpec (MLA, deepseek_v3; YaRN's factor and attention
// factor derived here) and io::HybridRopeSpec (qwen3_next / qwen3_5_moe_text / gpt_oss; partial
// rotation, factor and attention factor as parsed); both run the same frequency code.
#pragma once
#include <cstdint>
#include <vector>

#include "io/config_hybrid.h"
#include "io/rope_config.h"

namespace moesq::model {

// Inverse frequencies of the `dim` rotated dims ([dim/2], fp32) and the factor transformers applies
// to cos/sin (YaRN attention_factor; 1 for default RoPE).
struct RopeFrequencies {
  std::vector<float> inv_freq;  // [dim/2]
  float attention_factor = 1.0f;
};
// MLA: max_position_embeddings is the config's (YaRN with original_max_position_embeddings uses
// factor = max / original, as transformers does). Errors: dim odd or ≤ 0, a type other than default/yarn.
RopeFrequencies rope_frequencies(const io::RopeSpec& rope, int64_t dim, int64_t max_position_embeddings);
// The hybrid families: r.rotary_dim rotated dims, rounded to bf16 when r.inv_freq_bf16. Error: rotary_dim
// odd or < 2.
RopeFrequencies rope_frequencies(const io::HybridRopeSpec& r);
// Default RoPE over hd dims: 1 / θ^(2i/hd) in fp32, rounded to bf16 when bf16_inv_freq (transformers'
// inv_freq buffer after a bf16 checkpoint is loaded in its own dtype and upcast:
// ForwardOptions::rope_bf16_inv_freq).
RopeFrequencies default_rope_frequencies(double theta, int64_t hd, bool bf16_inv_freq = false);

// cos/sin tables for positions pos0 .. pos0+T−1: cos_t[t, i] = cos(pos · inv_freq[i]) · attention_factor
// (the angle rounded to fp32 as torch's fp32 outer product does). cos_t, sin_t: [T, dim/2].
void rope_tables(int64_t T, const RopeFrequencies& f, std::vector<float>& cos_t, std::vector<float>& sin_t,
                 int64_t pos0 = 0);
// Default RoPE tables for positions 0..T-1 (the built-in GQA attention, KvDecoder, the GPU engine):
// rope_tables(T, default_rope_frequencies(theta, hd, bf16_inv_freq), …); cos/sin: [T, hd/2].
void rope_tables(int64_t T, int64_t hd, double theta, std::vector<float>& cos_t, std::vector<float>& sin_t,
                 bool bf16_inv_freq = false);

// In place on one head vector v [dim]: v·cos + rotate_half(v)·sin (cos_row/sin_row: [dim/2]); with
// dim < head_dim only the leading dim values rotate (partial rotation).
void apply_rope(float* v, int64_t dim, const float* cos_row, const float* sin_row);

// In place on v [dim]: [v0, v1, v2, v3, …] → [v0, v2, …, v1, v3, …] (transformers'
// apply_rotary_pos_emb_interleave: view(d/2, 2).transpose), so that apply_rope then rotates the
// stored pairs (v_{2i}, v_{2i+1}) by frequency i (deepseek_v3 `rope_interleave`).
void deinterleave_pairs(float* v, int64_t dim);

}  // namespace moesq::model
