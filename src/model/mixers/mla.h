// Multi-head latent attention (DeepSeek-V2 §2.1, DeepSeek-V3 §2.1.1; transformers'
// DeepseekV3Attention), CPU, fp32, one causal sequence, the naive (non-absorbed) form:
//
//   q   = q_b(RMSNorm(q_a(x)))            or q_proj(x) without a q LoRA      [T, nh, nope + rope]
//   c, k_pe = split(kv_a_proj_with_mqa(x), [r_kv, rope])                    [T, r_kv], [T, rope]
//   k_nope, v = split(kv_b(RMSNorm(c)), [nope, v]) per head                 [T, nh, nope], [T, nh, v]
//   q_rot, k_pe = RoPE(q[..., nope:]), RoPE(k_pe)   (k_pe shared by all heads)
//   o   = o_proj(softmax_causal(cat(q_nope, q_rot) · cat(k_nope, k_pe)ᵀ · scale) · v)
//
// x is the layer's input AFTER input_layernorm; the result is the mixer output (before the residual).
//
// Decode (mla_decode, model/mixers/mla_decode.cpp) caches per position only the normalised latent
// ĉ_t = kv_a_layernorm(c_t) [r_kv] and the rotated shared key k_pe_t [rope] — r_kv + rope floats per
// token instead of nh·(d_qk + d_v) — and attends in the absorbed form (DeepSeek-V2 §2.1.2): with
// W_UK[h] [nope, r_kv] and W_UV[h] [v, r_kv] the rows of kv_b_proj of head h,
//   score_t = ((W_UK[h]ᵀ q_nope) · ĉ_t + q_rot · k_pe_t) · scale,   o[h] = W_UV[h] (Σ_t p_t ĉ_t),
// the same sums as the naive form in another association order.
#pragma once
#include <cstdint>
#include <vector>

#include "model/rope.h"

namespace moesq::model {

// transformers builds q_a_layernorm and kv_a_layernorm without the config's eps: always 1e-6.
inline constexpr double kMlaLatentNormEps = 1e-6;

struct MlaDims {
  int64_t hidden = 0;        // H
  int64_t num_heads = 0;     // nh
  int64_t q_lora_rank = 0;   // r_q; 0 = no q LoRA (q_proj)
  int64_t kv_lora_rank = 0;  // r_kv
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  bool rope_interleave = true;  // rope dims stored as interleaved pairs
  float softmax_scale = 1.0f;   // d_qk^-½ (× YaRN mscale²)
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

struct MlaWeights {
  std::vector<float> q_proj;     // [nh·d_qk, H]      (q_lora_rank == 0 only)
  std::vector<float> q_a_proj;   // [r_q, H]          (q_lora_rank > 0 only)
  std::vector<float> q_a_norm;   // [r_q]
  std::vector<float> q_b_proj;   // [nh·d_qk, r_q]
  std::vector<float> kv_a_proj;  // [r_kv + rope, H]  kv_a_proj_with_mqa
  std::vector<float> kv_a_norm;  // [r_kv]
  std::vector<float> kv_b_proj;  // [nh·(nope + v), r_kv]
  std::vector<float> o_proj;     // [H, nh·v]
  // attention_bias: q_a_proj [r_q], kv_a_proj [r_kv + rope], o_proj [H]; empty = none.
  std::vector<float> q_a_bias, kv_a_bias, o_bias;
};

// Zero weights with the shapes of `d` (tests and synthetic models fill them); biases only if asked.
MlaWeights mla_zero_weights(const MlaDims& d, bool attention_bias);

// cos/sin tables for the rope dims at positions 0..T-1: [T, rope/2] each (model/rope.h).
struct RopeTables {
  std::vector<float> cos, sin;
};

// x [T, H] → out [T, H]. Errors name the mismatching weight or table. threads: heads in parallel
// (0 = moesq::num_threads()).
void mla_forward(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T, float* out,
                 int threads = 0);
// Plain-loop twin (linear_ref, causal_attention_ref).
void mla_forward_ref(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T,
                     float* out);

// The per-token part the forward and the decode share, for rows at positions p0 .. p0+T−1 (BLAS
// linears): q [T, nh, d_qk] with its rope dims rotated, the normalised latent ĉ [T, r_kv] and the
// rotated shared key k_pe [T, rope]. `rope` must cover p0 + T positions.
void mla_project(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T, int64_t p0,
                 float* q, float* latent, float* k_pe);

// The latent KV cache of one sequence: positions 0 .. len−1 of at most max_len.
struct MlaLatentCache {
  int64_t len = 0, max_len = 0;
  std::vector<float> latent;  // [max_len, r_kv] ĉ_t
  std::vector<float> k_pe;    // [max_len, rope] rotated k_pe_t
};
MlaLatentCache mla_latent_cache(const MlaDims& d, int64_t max_len);

// x [T, H] (input-normed rows of positions cache.len .. cache.len+T−1) → out [T, H], appending the
// T positions to the cache first (each row attends to itself and every earlier position). `rope`
// must cover cache.len + T positions. Errors: the cache would pass max_len; shapes as mla_forward.
void mla_decode(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T,
                MlaLatentCache& cache, float* out);

}  // namespace moesq::model
