// Kernels of the mla_f32 launchers (mla_f32.h). Both are memory-bound element moves: one CTA per row.
// The rotation rounds each product and sum on its own (__fmul_rn / __fadd_rn / __fsub_rn: no FMA
// contraction), as the CPU twin does, so the two give the same bits.
#include "core/cuda/check.cuh"
#include "ops/mla_f32/mla_f32.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 128;

// Pair i of a rope vector at `v` (its stored layout): (a, b) = dims (i, i + half) after de-interleaving.
__device__ __forceinline__ void rotate_pair(const float* src, float* dst, int i, int half, bool interleave,
                                            float c, float s) {
  const float a = interleave ? src[2 * i] : src[i], b = interleave ? src[2 * i + 1] : src[half + i];
  dst[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  dst[half + i] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

__global__ void __launch_bounds__(kThreads) split_rope_kernel(MlaSplitRopeF32Args a) {
  extern __shared__ float sh[];  // [nh + 1, rope]: the row's stored rope vectors (heads, then k_pe)
  const int64_t t = blockIdx.x;
  const int64_t ckv_w = a.r_kv + a.rope, dqk = a.nope + a.rope;
  const int half = a.rope / 2;
  const float* ckv = a.ckv + t * ckv_w;
  float* q = a.q + t * a.nh * dqk;
  for (int i = threadIdx.x; i < a.r_kv; i += kThreads) a.latent[t * a.r_kv + i] = ckv[i];
  for (int i = threadIdx.x; i < (a.nh + 1) * a.rope; i += kThreads) {
    const int h = i / a.rope, e = i % a.rope;
    sh[i] = h < a.nh ? q[h * dqk + a.nope + e] : ckv[a.r_kv + e];
  }
  __syncthreads();
  const int64_t p = a.tok_pos[t];
  const float* c = a.cos + p * half;
  const float* s = a.sin + p * half;
  for (int i = threadIdx.x; i < (a.nh + 1) * half; i += kThreads) {
    const int h = i / half, e = i % half;
    float* dst = h < a.nh ? q + h * dqk + a.nope : a.k_pe + t * a.rope;
    rotate_pair(sh + h * a.rope, dst, e, half, a.interleave, c[e], s[e]);
  }
}

__global__ void __launch_bounds__(kThreads) expand_kv_kernel(MlaExpandKvF32Args a) {
  const int64_t t = blockIdx.x;
  const int64_t kv_w = a.nope + a.v_dim, dqk = a.nope + a.rope;
  const float* kv = a.kv + t * a.nh * kv_w;
  const float* kp = a.k_pe + t * a.rope;
  for (int64_t i = threadIdx.x; i < a.nh * dqk; i += kThreads) {
    const int64_t h = i / dqk, e = i % dqk;
    a.k[t * a.nh * dqk + i] = e < a.nope ? kv[h * kv_w + e] : kp[e - a.nope];
  }
  for (int64_t i = threadIdx.x; i < a.nh * a.v_dim; i += kThreads) {
    const int64_t h = i / a.v_dim, e = i % a.v_dim;
    a.v[t * a.nh * a.v_dim + i] = kv[h * kv_w + a.nope + e];
  }
}

}  // namespace

void mla_split_rope_f32(const MlaSplitRopeF32Args& a, cudaStream_t stream) {
  mla_split_rope_f32_check(a);
  if (a.n == 0) return;
  MOESQ_CHECK(a.n <= 0x7fffffff, "mla_split_rope_f32: ", a.n, " rows exceed the grid");
  const size_t smem = sizeof(float) * static_cast<size_t>(a.nh + 1) * static_cast<size_t>(a.rope);
  MOESQ_CHECK(smem <= 48 * 1024, "mla_split_rope_f32: ", a.nh, " heads × rope ", a.rope, " need ", smem,
              " B of shared memory (at most 48 KiB)");
  split_rope_kernel<<<static_cast<unsigned>(a.n), kThreads, smem, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("mla_split_rope_f32");
}

void mla_expand_kv_f32(const MlaExpandKvF32Args& a, cudaStream_t stream) {
  mla_expand_kv_f32_check(a);
  if (a.n == 0) return;
  MOESQ_CHECK(a.n <= 0x7fffffff, "mla_expand_kv_f32: ", a.n, " rows exceed the grid");
  expand_kv_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("mla_expand_kv_f32");
}

}  // namespace moesq::ops
