// Causal GQA attention kernel over the bf16 KV cache (attention.h): one warp per (token, head);
// lane l holds the head elements l, l+32, …; per key one fp32 dot (butterfly), online softmax;
// 16 warps split the keys into contiguous chunks and merge in a fixed order.
#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "ops/attention/attention.h"

namespace moesq::ops {

namespace {

constexpr int kWarps = 16;  // warps per (token, head): each takes one contiguous chunk of the keys
constexpr int kUnroll = 4;  // keys whose K rows are loaded and dotted together (ILP; same arithmetic)

__device__ __forceinline__ float bf(uint16_t u) { return __bfloat162float(__ushort_as_bfloat16(u)); }

// One CTA per (token, head). Warp w runs an online softmax over keys [w·C, (w+1)·C), C = ⌈(pos+1)/16⌉,
// then the 16 partial states merge in warp order. The split depends on the token's own position only,
// so a row's bits are the same in any batch (and in prefill and decode).
template <int kPer>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionArgs a) {
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_o[kWarps][kPer * 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = blockIdx.x;  // t · nh + h
  const int64_t t = item / a.nh;
  const int h = static_cast<int>(item % a.nh);
  const int kv = h / (a.nh / a.nkv);
  const int64_t pos = a.tok_pos[t], slot = a.tok_slot[t];
  if (pos < 0 || pos >= a.max_len) return;
  const int64_t chunk = (pos + kWarps) / kWarps;
  const int64_t j0 = warp * chunk, j1 = min(pos + 1, j0 + chunk);
  float q[kPer], o[kPer];
#pragma unroll
  for (int c = 0; c < kPer; ++c) {
    q[c] = a.q[item * a.hd + lane + 32 * c];
    o[c] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int64_t stride = static_cast<int64_t>(a.nkv) * a.hd;
  const uint16_t* kp = a.k_cache + (slot * a.max_len * a.nkv + kv) * a.hd + lane;
  const uint16_t* vp = a.v_cache + (slot * a.max_len * a.nkv + kv) * a.hd + lane;
  for (int64_t jb = j0; jb < j1; jb += kUnroll) {
    float d[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      d[u] = 0.0f;
      if (jb + u < j1) {
#pragma unroll
        for (int c = 0; c < kPer; ++c) d[u] = fmaf(q[c], bf(kp[(jb + u) * stride + 32 * c]), d[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int x = 16; x > 0; x /= 2) d[u] += __shfl_xor_sync(0xffffffffu, d[u], x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (jb + u >= j1) break;
      const float s = d[u] * a.scale;
      const float m_new = fmaxf(m, s);
      const float corr = __expf(m - m_new), p = __expf(s - m_new);
      l = fmaf(l, corr, p);
#pragma unroll
      for (int c = 0; c < kPer; ++c) o[c] = fmaf(o[c], corr, p * bf(vp[(jb + u) * stride + 32 * c]));
      m = m_new;
    }
  }
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
#pragma unroll
  for (int c = 0; c < kPer; ++c) s_o[warp][lane + 32 * c] = o[c];
  __syncthreads();
  float M = s_m[0];  // warp 0 always holds key 0
  for (int w = 1; w < kWarps; ++w) M = fmaxf(M, s_m[w]);
  float L = 0.0f;
  float f[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    f[w] = s_l[w] > 0.0f ? __expf(s_m[w] - M) : 0.0f;
    L = fmaf(s_l[w], f[w], L);
  }
  const float inv = 1.0f / L;
  for (int e = threadIdx.x; e < a.hd; e += kWarps * 32) {
    float acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) acc = fmaf(s_o[w][e], f[w], acc);
    const float o = acc * inv;
    const __nv_bfloat16 hi = __float2bfloat16_rn(o);
    a.out[item * a.hd + e] = __bfloat16_as_ushort(hi);
    if (a.out_lo) a.out_lo[item * a.hd + e] = __bfloat16_as_ushort(__float2bfloat16_rn(__fsub_rn(o, __bfloat162float(hi))));
  }
}

}  // namespace

void attention(const AttentionArgs& a, cudaStream_t stream) {
  attention_check(a);
  const int64_t items = a.T * a.nh;
  if (items == 0) return;
  MOESQ_CHECK(items <= 0x7fffffff, "attention: T·nh = ", items, " too large for the grid");
  const unsigned grid = static_cast<unsigned>(items);
  // Built: hd = 64, 128, 256 (Qwen3 uses 128; the tiny fixture 64); others are refused, never wrong.
  switch (a.hd / 32) {
    case 2: attention_kernel<2><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case 4: attention_kernel<4><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case 8: attention_kernel<8><<<grid, kWarps * 32, 0, stream>>>(a); break;
    default: MOESQ_FAIL("attention: head_dim ", a.hd, " not built (built: 64, 128, 256)");
  }
  MOESQ_CUDA_LAUNCH_CHECK("attention_kernel");
}

}  // namespace moesq::ops
