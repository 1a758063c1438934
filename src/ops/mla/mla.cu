// MLA kernels (mla.h). mla_prep / mla_q: one warp per (token, part or head); mla_attention: one CTA
// per (token, 4 query heads [, key range]) of 8 warps, the query rows in registers, the token's keys in 64-key
// chunks staged in shared memory by cp.async, scores by keys over warps, softmax by a warp per head,
// P·V by column slices over warps; mla_heads_to_rows: one thread per output element. fp32 arithmetic with explicit rounding
// intrinsics where the twin replays it bitwise.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "core/cuda/check.cuh"
#include "ops/gemm_bf16/cp_async.cuh"
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

// mla_attention's CTA: kMlaHeadsPerCta (4) query heads and 8 warps. Every warp takes keys for the
// scores; the first 4 one head each for the softmax; every warp a slice of ĉ's columns for P·V (the
// values are shared by all heads, so a warp reads each value once for all the CTA's heads).
constexpr int kAttnWarps = 2 * kMlaHeadsPerCta;  // 8: scores by keys over all, softmax by the first 4
constexpr int kMaxD32 = (kMlaMaxLatent + kMlaMaxRope + 31) / 32;  // query / key dims per lane
constexpr int kMaxGroups = (kMaxVals + kAttnWarps - 1) / kAttnWarps;  // 32-column groups of ĉ per warp

// The shared memory of one attention CTA (mla_attention_smem_bytes): the heads' scores / probabilities
// of one chunk, their chunk statistics and the chunk's cache rows.
struct AttnSmem {
  float* p;      // [heads, 64]
  float* stat;   // [heads, 2]: the chunk's (max, Σ exp) per head
  uint16_t* kv;  // [64, D]
};

__device__ AttnSmem attn_smem(unsigned char* smem) {
  AttnSmem s;
  s.p = reinterpret_cast<float*>(smem);
  s.stat = s.p + kMlaHeadsPerCta * kKvBlockTokens;
  s.kv = reinterpret_cast<uint16_t*>(s.stat + 2 * kMlaHeadsPerCta);
  return s;
}

// A thread's state: the query values of the CTA's heads at dims lane + 32i (registers; zeros past D and
// past nh), and per head the running (max, Σ exp) and Σ exp·ĉ at its warp's columns 32·(warp + 8g) + lane.
struct HeadsState {
  float m[kMlaHeadsPerCta], l[kMlaHeadsPerCta], o[kMlaHeadsPerCta][kMaxGroups];
  __device__ __forceinline__ void reset() {
#pragma unroll
    for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) {
      m[hh] = -INFINITY, l[hh] = 0.0f;
#pragma unroll
      for (int g = 0; g < kMaxGroups; ++g) o[hh][g] = 0.0f;
    }
  }
};

__device__ __forceinline__ void load_q(const MlaAttentionArgs& a, int64_t t, int h0, int D,
                                       float (&q)[kMlaHeadsPerCta][kMaxD32]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int hh = 0; hh < kMlaHeadsPerCta; ++hh)
#pragma unroll
    for (int i = 0; i < kMaxD32; ++i) {
      const int d = lane + 32 * i;
      q[hh][i] = h0 + hh < a.nh && d < D ? a.q[(static_cast<int64_t>(h0 + hh) * a.T + t) * D + d] : 0.0f;
    }
}

// One chunk's partial per head: mc = max score, lc = Σ exp(s − mc), oc = Σ exp(s − mc)·ĉ at the warp's
// columns. THE one definition both paths (sequential and split-KV) run: same operations in the same
// order, so a chunk's partial has the same bits in both. Per (head, column) the arithmetic is the
// twin's: score = butterfly of the lane fma chains over d ≡ lane (mod 32), scaled; p = exp(s − mc);
// Σ p·ĉ an fma chain over the keys in order. All threads of the CTA call it.
__device__ __forceinline__ void chunk_partial(const MlaAttentionArgs& a, const AttnSmem& sm, int64_t slot, int64_t pos,
                                              int64_t k0, int D, const float (&q)[kMlaHeadsPerCta][kMaxD32],
                                              HeadsState& c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nv = a.r_kv / 32;
  const int nk = static_cast<int>(min(static_cast<int64_t>(kKvBlockTokens), pos + 1 - k0));
  __syncthreads();  // the previous chunk's reads done
  const uint16_t* src = a.kv.cache + kv_row(a.kv.block_table, a.kv.max_len, slot, k0) * D;
  for (int i = threadIdx.x; i < nk * D / 8; i += blockDim.x) detail::cp_async16(sm.kv + 8 * i, src + 8 * i, true);
  detail::cp_async_commit();
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  // Scores: warp w takes keys w, w + 8, …, for all heads of the CTA.
  for (int j = warp; j < nk; j += kAttnWarps) {
    float acc[kMlaHeadsPerCta];
#pragma unroll
    for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) acc[hh] = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxD32; ++i) {
      const int d = lane + 32 * i;
      if (d < D) {
        const float k = from_bf16(sm.kv[j * D + d]);
#pragma unroll
        for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) acc[hh] = fmaf(q[hh][i], k, acc[hh]);
      }
    }
#pragma unroll
    for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) {
      const float sc = __fmul_rn(warp_sum(acc[hh]), a.scale);
      if (lane == 0) sm.p[hh * kKvBlockTokens + j] = sc;
    }
  }
  __syncthreads();
  if (warp < kMlaHeadsPerCta) {  // warp w = head w: the chunk's max, probabilities and Σ p
    float* p = sm.p + warp * kKvBlockTokens;
    const float x0 = lane < nk ? p[lane] : -INFINITY, x1 = lane + 32 < nk ? p[lane + 32] : -INFINITY;
    const float mc = warp_max(fmaxf(x0, x1));
    const float p0 = lane < nk ? expf(__fsub_rn(x0, mc)) : 0.0f;
    const float p1 = lane + 32 < nk ? expf(__fsub_rn(x1, mc)) : 0.0f;
    const float lc = warp_sum(__fadd_rn(p0, p1));
    __syncwarp();
    if (lane < nk) p[lane] = p0;
    if (lane + 32 < nk) p[lane + 32] = p1;
    if (lane == 0) sm.stat[2 * warp] = mc, sm.stat[2 * warp + 1] = lc;
  }
  __syncthreads();
#pragma unroll
  for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) {
    c.m[hh] = sm.stat[2 * hh], c.l[hh] = sm.stat[2 * hh + 1];
#pragma unroll
    for (int g = 0; g < kMaxGroups; ++g) c.o[hh][g] = 0.0f;
  }
  for (int j = 0; j < nk; ++j) {
    float pj[kMlaHeadsPerCta];
#pragma unroll
    for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) pj[hh] = sm.p[hh * kKvBlockTokens + j];
#pragma unroll
    for (int g = 0; g < kMaxGroups; ++g) {
      const int grp = warp + kAttnWarps * g;
      if (grp < nv) {
        const float v = from_bf16(sm.kv[j * D + 32 * grp + lane]);
#pragma unroll
        for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) c.o[hh][g] = fmaf(pj[hh], v, c.o[hh][g]);
      }
    }
  }
}

// Running state ← running state merged with a partial, per head (ascending order; starts at −∞, 0, 0).
__device__ __forceinline__ void merge(HeadsState& s, const HeadsState& c) {
#pragma unroll
  for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) {
    const float m_new = fmaxf(s.m[hh], c.m[hh]);
    const float alpha = expf(__fsub_rn(s.m[hh], m_new)), beta = expf(__fsub_rn(c.m[hh], m_new));
    s.l[hh] = __fadd_rn(__fmul_rn(s.l[hh], alpha), __fmul_rn(c.l[hh], beta));
#pragma unroll
    for (int g = 0; g < kMaxGroups; ++g) s.o[hh][g] = __fadd_rn(__fmul_rn(s.o[hh][g], alpha), __fmul_rn(c.o[hh][g], beta));
    s.m[hh] = m_new;
  }
}

__device__ __forceinline__ void write_out(const MlaAttentionArgs& a, int64_t t, int h0, const HeadsState& s) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nv = a.r_kv / 32;
#pragma unroll
  for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) {
    if (h0 + hh >= a.nh) break;
    const int64_t off = (static_cast<int64_t>(h0 + hh) * a.T + t) * a.r_kv;
#pragma unroll
    for (int g = 0; g < kMaxGroups; ++g) {
      const int col = 32 * (warp + kAttnWarps * g) + lane;
      if (col < 32 * nv)
        store_hi_lo(__fdiv_rn(s.o[hh][g], s.l[hh]), &a.out[off + col], a.out_lo ? &a.out_lo[off + col] : nullptr);
    }
  }
}

constexpr int64_t kRangeKeys = static_cast<int64_t>(kMlaRangeChunks) * kKvBlockTokens;

// Key range r of a token (positions [r · kRangeKeys, …] up to pos): its chunks' partials merged in
// ascending order from (−∞, 0, 0) into rs — the one range function of both paths.
__device__ __forceinline__ void range_partial(const MlaAttentionArgs& a, const AttnSmem& sm, int64_t slot, int64_t pos,
                                              int64_t r, int D, const float (&q)[kMlaHeadsPerCta][kMaxD32],
                                              HeadsState& rs) {
  rs.reset();
  HeadsState c;
  const int64_t k_end = min(pos + 1, (r + 1) * kRangeKeys);
  for (int64_t k0 = r * kRangeKeys; k0 < k_end; k0 += kKvBlockTokens) {
    chunk_partial(a, sm, slot, pos, k0, D, q, c);
    merge(rs, c);
  }
}

// Sequential path: grid (T, ⌈nh / 4⌉), 256 threads; the CTA walks its token's ranges in order.
__global__ void __launch_bounds__(kAttnWarps * 32, 2) mla_attention_kernel(MlaAttentionArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.r_kv + a.rope;
  const AttnSmem sm = attn_smem(smem);
  const int64_t t = blockIdx.x;
  const int h0 = blockIdx.y * kMlaHeadsPerCta;
  const int64_t slot = a.tok_slot[t], pos = a.tok_pos[t];
  if (pos < 0 || pos >= a.kv.max_len) return;  // uniform over the CTA; the twin reports it
  float q[kMlaHeadsPerCta][kMaxD32];
  load_q(a, t, h0, D, q);
  HeadsState s, rs;
  s.reset();
  for (int64_t r = 0; r * kRangeKeys <= pos; ++r) {
    range_partial(a, sm, slot, pos, r, D, q, rs);
    merge(s, rs);
  }
  write_out(a, t, h0, s);
}

// Split-KV path, step 1: grid (T, ⌈nh / 4⌉, partial_ranges); CTA z computes range z's partials
// [mr, lr, or_[r_kv]] of its heads into `partial` [T, nh, partial_ranges, r_kv + 2].
__global__ void __launch_bounds__(kAttnWarps * 32, 2) mla_attention_split_kernel(MlaAttentionArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.r_kv + a.rope;
  const AttnSmem sm = attn_smem(smem);
  const int64_t t = blockIdx.x, r = blockIdx.z;
  const int h0 = blockIdx.y * kMlaHeadsPerCta, warp = threadIdx.x / 32, lane = threadIdx.x % 32, nv = a.r_kv / 32;
  const int64_t slot = a.tok_slot[t], pos = a.tok_pos[t];
  if (pos < 0 || pos >= a.kv.max_len || r * kRangeKeys > pos) return;  // uniform over the CTA
  float q[kMlaHeadsPerCta][kMaxD32];
  load_q(a, t, h0, D, q);
  HeadsState rs;
  range_partial(a, sm, slot, pos, r, D, q, rs);
#pragma unroll
  for (int hh = 0; hh < kMlaHeadsPerCta; ++hh) {
    if (h0 + hh >= a.nh) break;
    float* dst = a.partial + ((t * a.nh + h0 + hh) * a.partial_ranges + r) * (a.r_kv + 2);
    if (warp == 0 && lane == 0) dst[0] = rs.m[hh], dst[1] = rs.l[hh];
#pragma unroll
    for (int g = 0; g < kMaxGroups; ++g) {
      const int col = 32 * (warp + kAttnWarps * g) + lane;
      if (col < 32 * nv) dst[2 + col] = rs.o[hh][g];
    }
  }
}

// Split-KV path, step 2: one warp per (token, head) merges the range partials in ascending order
// (columns lane + 32i; the same per-column arithmetic as merge(HeadsState&, …)).
__global__ void __launch_bounds__(32) mla_attention_combine_kernel(MlaAttentionArgs a) {
  const int64_t t = blockIdx.x / a.nh;
  const int h = static_cast<int>(blockIdx.x % a.nh), lane = threadIdx.x, nv = a.r_kv / 32;
  const int64_t pos = a.tok_pos[t];
  if (pos < 0 || pos >= a.kv.max_len) return;
  float m = -INFINITY, l = 0.0f, o[kMaxVals], or_[kMaxVals];
#pragma unroll
  for (int i = 0; i < kMaxVals; ++i) o[i] = 0.0f, or_[i] = 0.0f;
  for (int64_t r = 0; r * kRangeKeys <= pos; ++r) {
    const float* src = a.partial + ((t * a.nh + h) * a.partial_ranges + r) * (a.r_kv + 2);
#pragma unroll
    for (int i = 0; i < kMaxVals; ++i)
      if (i < nv) or_[i] = src[2 + lane + 32 * i];
    const float mc = src[0], lc = src[1];
    const float m_new = fmaxf(m, mc);
    const float alpha = expf(__fsub_rn(m, m_new)), beta = expf(__fsub_rn(mc, m_new));
    l = __fadd_rn(__fmul_rn(l, alpha), __fmul_rn(lc, beta));
#pragma unroll
    for (int i = 0; i < kMaxVals; ++i) o[i] = __fadd_rn(__fmul_rn(o[i], alpha), __fmul_rn(or_[i], beta));
    m = m_new;
  }
  const int64_t off = (static_cast<int64_t>(h) * a.T + t) * a.r_kv;
#pragma unroll
  for (int i = 0; i < kMaxVals; ++i)
    if (i < nv)
      store_hi_lo(__fdiv_rn(o[i], l), &a.out[off + lane + 32 * i], a.out_lo ? &a.out_lo[off + lane + 32 * i] : nullptr);
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
    const int most = static_cast<int>(mla_attention_smem_bytes(kMlaMaxLatent, kMlaMaxRope));
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(mla_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(mla_attention_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    attr = true;
  }
  MOESQ_CHECK(a.T <= 0x7fffffff, "mla_attention: ", a.T, " tokens too many for the grid");
  const unsigned groups = static_cast<unsigned>((a.nh + kMlaHeadsPerCta - 1) / kMlaHeadsPerCta);
  if (!a.partial) {
    mla_attention_kernel<<<dim3(static_cast<unsigned>(a.T), groups), kAttnWarps * 32, smem, stream>>>(a);
    MOESQ_CUDA_LAUNCH_CHECK("mla_attention_kernel");
    return;
  }
  MOESQ_CHECK(a.partial_ranges <= 65535, "mla_attention: ", a.partial_ranges, " key ranges too many for the split grid");
  mla_attention_split_kernel<<<dim3(static_cast<unsigned>(a.T), groups, static_cast<unsigned>(a.partial_ranges)),
                               kAttnWarps * 32, smem, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("mla_attention_split_kernel");
  mla_attention_combine_kernel<<<static_cast<unsigned>(a.T * a.nh), 32, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("mla_attention_combine_kernel");
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
