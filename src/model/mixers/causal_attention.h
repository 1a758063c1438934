// Causal multi-head softmax attention of one sequence, fp32, with separate q/k and v head widths
// (multi-head latent attention has d_qk = nope + rope ≠ d_v). Head h of row t reads
// q[t·q_stride + h·d_qk …], k[t·k_stride + h·d_qk …], v[t·v_stride + h·d_v …] and writes
// out[t·out_stride + h·d_v …]. Scores are q·k · scale, the softmax is fp32 with the row max
// subtracted, keys j > t get probability 0 (transformers' eager_attention_forward with a causal mask).
#pragma once
#include <cstdint>

namespace moesq::model {

struct CausalAttentionDesc {
  int64_t T = 0;          // tokens
  int64_t num_heads = 0;  // nh (k/v already expanded to nh heads)
  int64_t d_qk = 0, d_v = 0;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0, out_stride = 0;  // floats between rows
  float scale = 1.0f;
  int threads = 0;  // heads in parallel; 0 = moesq::num_threads()
};

// Fast path: per head, blocks of query rows × the causal key prefix as two sgemm calls.
void causal_attention(const CausalAttentionDesc& d, const float* q, const float* k, const float* v, float* out);
// Plain-loop twin (one query row at a time, fp32 dot products in index order).
void causal_attention_ref(const CausalAttentionDesc& d, const float* q, const float* k, const float* v, float* out);

}  // namespace moesq::model
