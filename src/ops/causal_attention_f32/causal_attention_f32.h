// Launcher: causal GQA attention in fp32 over many sequences packed row after row — compression's
// fp32 layer forward on the GPU (compress/attention_cuda), the math of model::gqa_attention:
//   out[t, i·hd_v : (i+1)·hd_v] = Σ_{j = lo(t)}^{t} softmax_j(scale · q_t,i · k_j,g) · v_j,g,
// g = i / (nh / nkv) the KV head of query head i, lo(t) = max(row_start[t], t − window + 1) (window 0:
// row_start[t], the first row of t's sequence). The kernel runs one warp per (row, head) with an
// online softmax (running max and sum, rescaled per key); the twin is the plain two-pass definition
// (max, exp, sum, normalise, as model::gqa_attention_ref), so they agree within expf's ulps and the
// rescaling's roundings (tests/gpu/test_layer_cuda.cu names the tolerance). Values may be narrower than
// keys (hd_v < hd: multi-head latent attention's naive form, compress/mla_cuda.cu, with nkv = nh).
// CPU twin: causal_attention_f32_ref.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct CausalAttentionF32Args {
  const float* q = nullptr;          // [n, nh·hd] fp32 (RoPE applied)
  const float* k = nullptr;          // [n, nkv·hd] fp32 (RoPE applied)
  const float* v = nullptr;          // [n, nkv·hd_v] fp32
  const int64_t* row_start = nullptr;  // [n] first row of each row's sequence (sequences contiguous)
  float* out = nullptr;              // [n, nh·hd_v] fp32
  int64_t n = 0;
  int nh = 0, nkv = 0, hd = 0;       // nh % nkv == 0; 0 < hd ≤ 256 (q/k head dim)
  int64_t window = 0;                // > 0: sliding window (t sees j with t − j < window); 0: full causal
  float scale = 1.0f;                // 1/sqrt(hd) for GQA families; MLA: d_qk^-½ × YaRN mscale²
  int hd_v = 0;                      // value head dim, 0 < hd_v ≤ 256; 0 = hd
  int v_dim() const { return hd_v > 0 ? hd_v : hd; }
};

// Errors (moesq::Error): bad heads or head_dim, a null pointer; the twin also a row_start that is not
// the first row of a contiguous sequence holding the row (the kernel trusts it).
void causal_attention_f32(const CausalAttentionF32Args& a, cudaStream_t stream);
void causal_attention_f32_check(const CausalAttentionF32Args& a);
void causal_attention_f32_ref(const CausalAttentionF32Args& a);

}  // namespace moesq::ops
