// Launchers: the per-token steps of multi-head latent attention in fp32, for compression's layer forward
// on the GPU (compress/mla_cuda.cu), the math of model::mla_forward's naive form (model/mixers/mla.h;
// DeepSeek-V2 §2.1, DeepSeek-V3 §2.1.1) between its GEMMs:
//   mla_split_rope_f32: ckv = kv_a_proj_with_mqa(x) [n, r_kv + rope] → the latent c [n, r_kv] (copied;
//     the caller RMSNorms it) and the shared key k_pe [n, rope], RoPE-rotated; and the rope dims of
//     every query head q[t, h, nope:] rotated in place. Stored pairs are de-interleaved first when
//     `interleave` (DeepSeek's checkpoints), then rotated as model::apply_rope:
//       (a, b) → (a·cos − b·sin, b·cos + a·sin), a = dim i, b = dim i + rope/2.
//   mla_expand_kv_f32: kv = kv_b_proj(RMSNorm(c)) [n, nh, nope + v] and k_pe → the per-head keys
//     k [n, nh, nope + rope] = [k_nope | k_pe] (k_pe shared by all heads) and values v [n, nh, v].
// Both are element moves and the rotation's products and sums, each rounded as the CPU rounds them (no
// fused multiply-add), so kernel and twin give the same bits (tests/gpu/test_layer_cuda.cu). CPU twins:
// the *_ref functions; tests/compress/test_layer_gpu_twins.cpp runs the twins' chain against the CPU
// MlaMixer of the DeepSeek-V3 fixture.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct MlaSplitRopeF32Args {
  const float* ckv = nullptr;  // [n, r_kv + rope] fp32: latent c, then k_pe (before RoPE)
  float* q = nullptr;          // [n, nh, nope + rope] fp32, the rope dims of each head rotated in place
  const float* cos = nullptr;  // [max_len, rope/2] RoPE tables (position-major)
  const float* sin = nullptr;
  const int32_t* tok_pos = nullptr;  // [n] position of each row, in [0, max_len)
  float* latent = nullptr;     // [n, r_kv] out: c
  float* k_pe = nullptr;       // [n, rope] out: rotated k_pe
  int64_t n = 0, max_len = 0;
  int nh = 0, r_kv = 0, nope = 0, rope = 0;  // rope even, > 0; r_kv > 0; nope ≥ 0
  bool interleave = true;      // rope dims stored as interleaved pairs (x0, y0, x1, y1, …)
};

struct MlaExpandKvF32Args {
  const float* kv = nullptr;    // [n, nh, nope + v] fp32
  const float* k_pe = nullptr;  // [n, rope] fp32 (rotated)
  float* k = nullptr;           // [n, nh, nope + rope] out
  float* v = nullptr;           // [n, nh, v] out
  int64_t n = 0;
  int nh = 0, nope = 0, rope = 0, v_dim = 0;  // nope ≥ 0, rope > 0, v_dim > 0
};

// Errors (moesq::Error): bad dims (naming them), a null pointer; the twin of mla_split_rope_f32 also a
// position outside [0, max_len) (the kernel trusts tok_pos).
void mla_split_rope_f32(const MlaSplitRopeF32Args& a, cudaStream_t stream);
void mla_split_rope_f32_check(const MlaSplitRopeF32Args& a);
void mla_split_rope_f32_ref(const MlaSplitRopeF32Args& a);

void mla_expand_kv_f32(const MlaExpandKvF32Args& a, cudaStream_t stream);
void mla_expand_kv_f32_check(const MlaExpandKvF32Args& a);
void mla_expand_kv_f32_ref(const MlaExpandKvF32Args& a);

}  // namespace moesq::ops
