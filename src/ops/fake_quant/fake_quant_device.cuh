// Device helpers of the fake_quant kernels (fake_quant.cu), shared with kernels that quantize a row
// they produced themselves (swiglu_train's fused SwiGLU + Q_a): the per-value fake quantization in
// format/nvfp4.cpp's fp32 order and the per-row Q_a of one CTA's row — the same bits wherever used.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "ops/common/nvfp4_row.cuh"

namespace moesq::ops::detail {

// γ of Eq. 5 from an amax (format::nvfp4_tensor_scale).
__device__ __forceinline__ float tensor_scale(float amax) {
  if (!(amax > 0.0f)) return 1.0f;
  const float g = 2688.0f / amax;
  return isfinite(g) ? g : 1.0f;
}

// Fake-quantizes value v whose `block`-lane group (aligned in the warp) shares one code under γ;
// *unscaled = dec(q)·s (the value before the division by γ: exact in bf16).
__device__ __forceinline__ float fake_quant_value(float v, float gamma, int block, float* unscaled) {
  float bmax = fabsf(v);
  for (int o = block / 2; o > 0; o >>= 1) bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, o));
  const float s = ue4m3_decode(ue4m3_encode(gamma * bmax / 6.0f));
  *unscaled = 0.0f;
  if (!(s > 0.0f)) return 0.0f;
  const float mult = gamma / s;
  *unscaled = e2m1_decode(e2m1_encode(v * mult)) * s;
  return *unscaled / gamma;
}

__device__ __forceinline__ void flag_nonfinite(float v, int32_t* nonfinite) {
  if (nonfinite && !isfinite(v)) *nonfinite = 1;
}

// Q_a of one row of K values (Eq. 4: γ from the row's amax, `block`-value UE4M3 codes), computed by the
// whole CTA (blockDim.x a multiple of 32): reads `in` (shared or global), writes the fake-quantized
// values to `out` (may be `in`), and optionally the unscaled values as bf16 (urow [K]) and γ (*gamma_out).
// A non-finite input sets *nonfinite. s_red: 32 floats of shared scratch.
__device__ inline void quantize_row_q_a(const float* in, float* out, int64_t K, int block, int32_t* nonfinite,
                                        uint16_t* unscaled_row, float* gamma_out, float* s_red) {
  __nv_bfloat16* urow = reinterpret_cast<__nv_bfloat16*>(unscaled_row);
  float m = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) {
    flag_nonfinite(in[k], nonfinite);
    m = fmaxf(m, fabsf(in[k]));
  }
  const float gamma = tensor_scale(block_max(m, s_red));
  if (gamma_out && threadIdx.x == 0) *gamma_out = gamma;
  // K % 32 == 0 is not guaranteed for block 16: pad the loop to whole warps, lanes past K idle.
  const int64_t K_warps = (K + 31) / 32 * 32;
  for (int64_t k = threadIdx.x; k < K_warps; k += blockDim.x) {
    const float v = k < K ? in[k] : 0.0f;
    float u;
    const float q = fake_quant_value(v, gamma, block, &u);
    if (k < K) {
      out[k] = q;
      if (urow) urow[k] = __float2bfloat16_rn(u);
    }
  }
}

}  // namespace moesq::ops::detail
