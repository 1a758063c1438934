// Kernel of the causal_attention_f32 launcher (causal_attention_f32.h): one warp per (row, head), lane
// l holding the head elements l, l + 32, … (coalesced loads of each key and value row; elements past hd
// or hd_v are zeros that no store reaches); the warps of a CTA are consecutive heads of one row, so the
// query heads of a KV group read its keys from L1.
#include <algorithm>

#include "core/cuda/check.cuh"
#include "ops/causal_attention_f32/causal_attention_f32.h"

namespace moesq::ops {

namespace {

constexpr int kWarps = 8;
constexpr int kMaxPerLane = 256 / 32;

template <int kPer>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(CausalAttentionF32Args a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= a.n * a.nh) return;
  const int64_t t = item / a.nh;
  const int i = static_cast<int>(item % a.nh), g = i / (a.nh / a.nkv);
  const int dv = a.hd_v > 0 ? a.hd_v : a.hd;
  const int64_t qw = static_cast<int64_t>(a.nh) * a.hd, kw = static_cast<int64_t>(a.nkv) * a.hd;
  const int64_t ow = static_cast<int64_t>(a.nh) * dv, vw = static_cast<int64_t>(a.nkv) * dv;
  const int64_t s0 = a.row_start[t];
  const int64_t lo = a.window > 0 ? max(s0, t - a.window + 1) : s0;
  float q[kPer], acc[kPer];
  const float* qt = a.q + t * qw + static_cast<int64_t>(i) * a.hd;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    q[e] = lane + 32 * e < a.hd ? qt[lane + 32 * e] : 0.0f;
    acc[e] = 0.0f;
  }
  float mx = -INFINITY, sum = 0.0f;
  for (int64_t j = lo; j <= t; ++j) {
    const float* kj = a.k + j * kw + static_cast<int64_t>(g) * a.hd;
    float d = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e)
      if (lane + 32 * e < a.hd) d = fmaf(q[e], kj[lane + 32 * e], d);
#pragma unroll
    for (int h = 16; h > 0; h /= 2) d += __shfl_xor_sync(0xffffffffu, d, h);
    const float s = d * a.scale;
    const float m2 = fmaxf(mx, s);
    const float corr = expf(mx - m2), p = expf(s - m2);  // corr = 0 at the first key (mx = −inf)
    sum = sum * corr + p;
    const float* vj = a.v + j * vw + static_cast<int64_t>(g) * dv;
#pragma unroll
    for (int e = 0; e < kPer; ++e)
      if (lane + 32 * e < dv) acc[e] = fmaf(p, vj[lane + 32 * e], acc[e] * corr);
    mx = m2;
  }
  const float inv = 1.0f / sum;
  float* o = a.out + t * ow + static_cast<int64_t>(i) * dv;
#pragma unroll
  for (int e = 0; e < kPer; ++e)
    if (lane + 32 * e < dv) o[lane + 32 * e] = acc[e] * inv;
}

}  // namespace

void causal_attention_f32(const CausalAttentionF32Args& a, cudaStream_t stream) {
  causal_attention_f32_check(a);
  const int64_t items = a.n * a.nh;
  if (items == 0) return;
  const int64_t blocks = (items + kWarps - 1) / kWarps;
  MOESQ_CHECK(blocks <= 0x7fffffff, "causal_attention_f32: ", items, " (row, head) items exceed the grid");
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarps * 32);
  switch ((std::max(a.hd, a.v_dim()) + 31) / 32) {  // elements per lane
    case 1: attention_kernel<1><<<grid, block, 0, stream>>>(a); break;
    case 2: attention_kernel<2><<<grid, block, 0, stream>>>(a); break;
    case 3: attention_kernel<3><<<grid, block, 0, stream>>>(a); break;
    case 4: attention_kernel<4><<<grid, block, 0, stream>>>(a); break;
    case 5: attention_kernel<5><<<grid, block, 0, stream>>>(a); break;
    case 6: attention_kernel<6><<<grid, block, 0, stream>>>(a); break;
    case 7: attention_kernel<7><<<grid, block, 0, stream>>>(a); break;
    default: attention_kernel<kMaxPerLane><<<grid, block, 0, stream>>>(a); break;
  }
  MOESQ_CUDA_LAUNCH_CHECK("causal_attention_f32");
}

}  // namespace moesq::ops
