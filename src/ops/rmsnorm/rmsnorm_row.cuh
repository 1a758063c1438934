// Device function of RMSNorm (rmsnorm.h): one row by one CTA of kRmsNormThreads threads, the fp64
// tree in its fixed order. The rmsnorm kernel runs it one CTA per row; moe_combine runs it on the
// residual row it has just updated (MoeCombineArgs::fused_norm) — the same code, so the same bits.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "ops/rmsnorm/rmsnorm.h"

namespace moesq::ops::detail {

constexpr int kRmsNormThreads = 256;  // the tree's width: the calling CTA must have exactly this many threads

// Row `row` of a (x → y / y_lo / y_f32). s_part: [kRmsNormThreads] fp64 shared scratch. Every thread of
// the CTA calls it; x's row must be visible to all of them (written before a __syncthreads, or by an
// earlier kernel). Each thread reads x[i] before writing i (y_f32 may be x).
__device__ inline void rmsnorm_row(const RmsNormArgs& a, int64_t row, double* s_part) {
  const float* xr = a.x + row * a.D;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < a.D; i += kRmsNormThreads)  // _rn: no fma contraction, as the CPU twin
    s = __dadd_rn(s, __dmul_rn(static_cast<double>(xr[i]), static_cast<double>(xr[i])));
  s_part[threadIdx.x] = s;
  __syncthreads();
  for (int h = kRmsNormThreads / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) s_part[threadIdx.x] = __dadd_rn(s_part[threadIdx.x], s_part[threadIdx.x + h]);
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(s_part[0] / static_cast<double>(a.D) + a.eps));
  const int64_t o = row * a.D;
  for (int64_t i = threadIdx.x; i < a.D; i += kRmsNormThreads) {
    const float v = __fmul_rn(a.w[i], __fmul_rn(xr[i], inv));
    if (a.y_f32) a.y_f32[o + i] = v;
    if (!a.y) continue;
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    a.y[o + i] = __bfloat16_as_ushort(hi);
    if (a.y_lo) a.y_lo[o + i] = __bfloat16_as_ushort(__float2bfloat16_rn(__fsub_rn(v, __bfloat162float(hi))));
  }
}

}  // namespace moesq::ops::detail
