// MLA kernels (mla.h). mla_prep / mla_q: one warp per (token, part or head); mla_attention: one CTA
// per (token, 8 query heads), one warp per head, the token's keys in 64-key chunks staged in shared
// memory; mla_heads_to_rows: one thread per output element. fp32 arithmetic with explicit rounding
// intrinsics where the twin replays it bitwise.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "core/cuda/check.cuh"
#include "ops/mla/mla.h"

namespace moesq::ops {

namespace {

constexpr int kWarps = 8;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxVals = kMlaMaxLatent / 32;  // o values per lane in mla_attention

__device__ __forceinline__ uint16_t to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float from_bf16(uint16_t h) { return __bfloat162float(__ushort_as_bfloat16(h)); }

__device__ __forceinline__ void store_hi_lo(float y, uint16_t* hi, uint16_t* lo) {
  const uint16_t h = to_bf16(y);
  *hi = h;
  if (lo) *lo = to_bf16(__fsub_rn(y, from_bf16(h)));
}

// RMSNorm scale of x [n] (fp64 lane sums, butterfly 1..16: the twin's inv_rms).
__device__ float warp_inv_rms(const float* x, int n, double eps, int lane) {
  double s = 0.0;
  for (int i = lane; i < n; i += 32) {
    const double v = static_cast<double>(x[i]);
    s = __dadd_rn(s, __dmul_rn(v, v));
  }
  for (int h = 1; h < 32; h *= 2) s = __dadd_rn(s, __shfl_xor_sync(kFull, s, h));
  return static_cast<float>(1.0 / sqrt(s / static_cast<double>(n) + eps));
}

__device__ __forceinline__ void rope_pair(const float* x, int rope, bool interleave, int i, float& lo, float& hi) {
  lo = interleave ? x[2 * i] : x[i];
  hi = interleave ? x[2 * i + 1] : x[i + rope / 2];
}

__device__ __forceinline__ float rot0(float lo, float hi, float c, float s) {
  return __fsub_rn(__fmul_rn(lo, c), __fmul_rn(hi, s));
}
__device__ __forceinline__ float rot1(float lo, float hi, float c, float s) {
  return __fadd_rn(__fmul_rn(hi, c), __fmul_rn(lo, s));
}

// Item 2t: token t's q LoRA norm; item 2t + 1: its latent norm and k_pe RoPE, appended to the cache.
__global__ void __launch_bounds__(kWarps * 32) mla_prep_kernel(MlaPrepArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= 2 * a.T) return;
  const int64_t t = item / 2;
  const float* row = a.a + t * a.lda;
  if (item % 2 == 0) {
    if (a.r_q == 0) return;
    const float inv = warp_inv_rms(row, a.r_q, a.eps, lane);
    for (int i = lane; i < a.r_q; i += 32)
      store_hi_lo(__fmul_rn(a.q_a_norm[i], __fmul_rn(row[i], inv)), &a.qa_out[t * a.r_q + i],
                  a.qa_out_lo ? &a.qa_out_lo[t * a.r_q + i] : nullptr);
    return;
  }
  const int64_t slot = a.tok_slot[t], pos = a.tok_pos[t];
  if (pos < 0 || pos >= a.kv.max_len) return;  // caller's bug; the twin reports it
  const int D = a.r_kv + a.rope, half = a.rope / 2;
  uint16_t* dst = a.kv.cache + kv_row(a.kv.block_table, a.kv.max_len, slot, pos) * D;
  const float* c = row + a.q_cols;
  const float inv = warp_inv_rms(c, a.r_kv, a.eps, lane);
  for (int i = lane; i < a.r_kv; i += 32) dst[i] = to_bf16(__fmul_rn(a.kv_a_norm[i], __fmul_rn(c[i], inv)));
  const float* kp = c + a.r_kv;
  const float* cs = a.cos + pos * half;
  const float* sn = a.sin + pos * half;
  for (int i = lane; i < half; i += 32) {
    float lo, hi;
    rope_pair(kp, a.rope, a.rope_interleave, i, lo, hi);
    dst[a.r_kv + i] = to_bf16(rot0(lo, hi, cs[i], sn[i]));
    dst[a.r_kv + half + i] = to_bf16(rot1(lo, hi, cs[i], sn[i]));
  }
}

__global__ void __launch_bounds__(kWarps * 32) mla_q_kernel(MlaQArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= a.T * a.nh) return;
  const int64_t t = item / a.nh;
  const int h = static_cast<int>(item % a.nh);
  const int64_t pos = a.tok_pos[t];
  if (pos < 0 || pos >= a.max_len) return;
  const int dqk = a.nope + a.rope, D = a.r_kv + a.rope, half = a.rope / 2;
  const float* x = a.q + t * a.ldq + static_cast<int64_t>(h) * dqk;
  const int64_t o = (static_cast<int64_t>(h) * a.T + t) * a.nope;
  for (int i = lane; i < a.nope; i += 32)
    store_hi_lo(x[i], &a.q_nope[o + i], a.q_nope_lo ? &a.q_nope_lo[o + i] : nullptr);
  float* qa = a.q_att + (static_cast<int64_t>(h) * a.T + t) * D + a.r_kv;
  const float* cs = a.cos + pos * half;
  const float* sn = a.sin + pos * half;
  for (int i = lane; i < half; i += 32) {
    float lo, hi;
    rope_pair(x + a.nope, a.rope, a.rope_interleave, i, lo, hi);
    qa[i] = rot0(lo, hi, cs[i], sn[i]);
    qa[half + i] = rot1(lo, hi, cs[i], sn[i]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int h = 1; h < 32; h *= 2) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, h));
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int h = 1; h < 32; h *= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, h));
  return v;
}

// grid (T, ⌈nh / 8⌉), 256 threads; dynamic smem mla_attention_smem_bytes.
__global__ void __launch_bounds__(kWarps * 32) mla_attention_kernel(MlaAttentionArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.r_kv + a.rope;
  float* s_q = reinterpret_cast<float*>(smem);             // [8, D] query rows of the CTA's heads
  float* s_p = s_q + kMlaHeadsPerCta * D;                   // [8, 64] scores, then probabilities
  uint16_t* s_kv = reinterpret_cast<uint16_t*>(s_p + kMlaHeadsPerCta * kKvBlockTokens);  // [64, D] chunk
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x;
  const int h0 = blockIdx.y * kMlaHeadsPerCta, h = h0 + warp;
  const int64_t slot = a.tok_slot[t], pos = a.tok_pos[t];
  if (pos < 0 || pos >= a.kv.max_len) return;  // uniform over the CTA; the twin reports it
  for (int i = threadIdx.x; i < kMlaHeadsPerCta * D; i += blockDim.x) {
    const int hh = h0 + i / D;
    s_q[i] = hh < a.nh ? a.q[(static_cast<int64_t>(hh) * a.T + t) * D + i % D] : 0.0f;
  }
  const int nv = a.r_kv / 32;
  float m = -INFINITY, l = 0.0f, o[kMaxVals];
#pragma unroll
  for (int i = 0; i < kMaxVals; ++i) o[i] = 0.0f;
  for (int64_t k0 = 0; k0 <= pos; k0 += kKvBlockTokens) {
    const int nk = static_cast<int>(min(static_cast<int64_t>(kKvBlockTokens), pos + 1 - k0));
    __syncthreads();  // q staged / the previous chunk's reads done
    const uint4* src =
        reinterpret_cast<const uint4*>(a.kv.cache + kv_row(a.kv.block_table, a.kv.max_len, slot, k0) * D);
    for (int i = threadIdx.x; i < nk * D / 8; i += blockDim.x) reinterpret_cast<uint4*>(s_kv)[i] = src[i];
    __syncthreads();
    // Scores: warp w takes keys w, w + 8, …, for all 8 heads of the CTA.
    for (int j = warp; j < nk; j += kWarps) {
      float acc[kMlaHeadsPerCta];
#pragma unroll
      for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) acc[hh] = 0.0f;
      for (int d = lane; d < D; d += 32) {
        const float k = from_bf16(s_kv[j * D + d]);
#pragma unroll
        for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) acc[hh] = fmaf(s_q[hh * D + d], k, acc[hh]);
      }
#pragma unroll
      for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) {
        const float sc = __fmul_rn(warp_sum(acc[hh]), a.scale);
        if (lane == 0) s_p[hh * kKvBlockTokens + j] = sc;
      }
    }
    __syncthreads();
    // This warp's head: chunk max, probabilities, Σ p, then Σ p·ĉ for dims lane + 32i.
    float* p = s_p + warp * kKvBlockTokens;
    const float x0 = lane < nk ? p[lane] : -INFINITY, x1 = lane + 32 < nk ? p[lane + 32] : -INFINITY;
    const float mc = warp_max(fmaxf(x0, x1));
    const float p0 = lane < nk ? expf(__fsub_rn(x0, mc)) : 0.0f;
    const float p1 = lane + 32 < nk ? expf(__fsub_rn(x1, mc)) : 0.0f;
    const float lc = warp_sum(__fadd_rn(p0, p1));
    __syncwarp();
    if (lane < nk) p[lane] = p0;
    if (lane + 32 < nk) p[lane + 32] = p1;
    __syncwarp();
    float oc[kMaxVals];
#pragma unroll
    for (int i = 0; i < kMaxVals; ++i) oc[i] = 0.0f;
    for (int j = 0; j < nk; ++j) {
      const float pj = p[j];
#pragma unroll
      for (int i = 0; i < kMaxVals; ++i)
        if (i < nv) oc[i] = fmaf(pj, from_bf16(s_kv[j * D + lane + 32 * i]), oc[i]);
    }
    const float m_new = fmaxf(m, mc);
    const float alpha = expf(__fsub_rn(m, m_new)), beta = expf(__fsub_rn(mc, m_new));
    l = __fadd_rn(__fmul_rn(l, alpha), __fmul_rn(lc, beta));
#pragma unroll
    for (int i = 0; i < kMaxVals; ++i) o[i] = __fadd_rn(__fmul_rn(o[i], alpha), __fmul_rn(oc[i], beta));
    m = m_new;
  }
  if (h >= a.nh) return;
  const int64_t off = (static_cast<int64_t>(h) * a.T + t) * a.r_kv;
#pragma unroll
  for (int i = 0; i < kMaxVals; ++i)
    if (i < nv) store_hi_lo(__fdiv_rn(o[i], l), &a.out[off + lane + 32 * i], a.out_lo ? &a.out_lo[off + lane + 32 * i] : nullptr);
}

__global__ void mla_heads_to_rows_kernel(MlaHeadsToRowsArgs a) {
  const int64_t n = a.T * a.nh * a.v;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / (int64_t(a.nh) * a.v), r = e % (int64_t(a.nh) * a.v);
    const int64_t h = r / a.v, j = r % a.v;
    store_hi_lo(a.x[(h * a.T + t) * a.v + j], &a.y[e], a.y_lo ? &a.y_lo[e] : nullptr);
  }
}

}  // namespace

void mla_prep(const MlaPrepArgs& a, cudaStream_t stream) {
  mla_prep_check(a);
  if (a.T == 0) return;
  mla_prep_kernel<<<static_cast<unsigned>((2 * a.T + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("mla_prep_kernel");
}

void mla_q(const MlaQArgs& a, cudaStream_t stream) {
  mla_q_check(a);
  if (a.T == 0) return;
  mla_q_kernel<<<static_cast<unsigned>((a.T * a.nh + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("mla_q_kernel");
}

void mla_attention(const MlaAttentionArgs& a, cudaStream_t stream) {
  mla_attention_check(a);
  if (a.T == 0) return;
  const size_t smem = mla_attention_smem_bytes(a.r_kv, a.rope);
  static bool attr = false;  // the largest built size, set once (not a stream operation: capture-safe)
  if (!attr) {
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(mla_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(mla_attention_smem_bytes(kMlaMaxLatent, kMlaMaxRope))));
    attr = true;
  }
  const dim3 grid(static_cast<unsigned>(a.T), static_cast<unsigned>((a.nh + kMlaHeadsPerCta - 1) / kMlaHeadsPerCta));
  mla_attention_kernel<<<grid, kWarps * 32, smem, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("mla_attention_kernel");
}

void mla_heads_to_rows(const MlaHeadsToRowsArgs& a, cudaStream_t stream) {
  mla_heads_to_rows_check(a);
  const int64_t n = a.T * a.nh * a.v;
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536));
  mla_heads_to_rows_kernel<<<blocks, 256, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("mla_heads_to_rows_kernel");
}

}  // namespace moesq::ops
