// Device helpers shared by the two activation-producing kernels (act_dispatch.cu, swiglu_quant.cu):
// NVFP4 quantization of one row held in shared memory, written in the K order of the GEMM kernel
// that reads it (format/kernel_layout.h ActLayout, act_storage_index). CPU twin: moe::act_quant_row_ref.
//
// Non-obvious decision: every fp32 operation is written in the order of format/nvfp4.cpp
// (γ = 2688/amax; code = UE4M3((γ·amax_b)/6); multiplier γ/s; q = E2M1(x·(γ/s))) and the E4M3
// encoder is the hardware cvt.rn.satfinite (round to nearest even, saturate at 448 — the CPU
// codec's rule), so the GPU output is bit-identical to the reference, not merely close.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cstdint>

#include "format/kernel_layout.h"

namespace moesq::cuda::detail {

constexpr int kActBlock = 32;  // NVFP4 activation scale block (format::kActScaleBlock)

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// UE4M3 code → value (exact). Normal codes map bit-for-bit into fp32; subnormals are c·2^-9.
__device__ __forceinline__ float ue4m3_decode(uint32_t c) {
  return c < 8 ? static_cast<float>(c) * 0x1p-9f : __uint_as_float(((c & 0x7f) << 20) + (120u << 23));
}

// UE4M3 encode of a non-negative finite value: RNE, saturating at 448 (format::ue4m3_encode).
__device__ __forceinline__ uint32_t ue4m3_encode(float v) {
  return static_cast<uint32_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

// E2M1 encode: round to nearest, ties to the even code, saturating at 6 (format::e2m1_encode).
__device__ __forceinline__ uint32_t e2m1_encode(float x) {
  const uint32_t sign = signbit(x) ? 8u : 0u;
  const float a = fabsf(x);
  uint32_t code;
  if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return sign | code;
}

// E2M1 decode: codes 0–3 are 0, .5, 1, 1.5 (= code/2); codes 4–7 are 2^(code/2 − 1)·(1 or 1.5).
__device__ __forceinline__ float e2m1_decode(uint32_t code) {
  const uint32_t c = code & 7;
  const float m = c < 4 ? 0.5f * static_cast<float>(c) : static_cast<float>(1u << ((c >> 1) - 1)) * ((c & 1) ? 1.5f : 1.0f);
  return (code & 8) ? -m : m;
}

// Activation layouts as ints, equal to moe::ActLayout's values (kernel_layout.h; the launchers
// static_assert it), so this header stays free of host-library includes.
constexpr int kActLayoutMmaFragment = 0;  // 4:8 → 2:4, then B-fragment order (mma.sp kernel)
constexpr int kActLayoutKMajor = 1;       // 4:8 → 2:4 only (wgmma.sp kernel, K-major smem B tile)
static_assert(static_cast<int>(moe::ActLayout::kMmaFragment) == kActLayoutMmaFragment &&
                  static_cast<int>(moe::ActLayout::kKMajor) == kActLayoutKMajor,
              "the device layout ints must equal moe::ActLayout");

// Storage index of logical column kk (0..31) inside its 32-wide k-step in `layout`
// (moe::act_storage_index, kernel_layout.cpp).
__host__ __device__ constexpr int act_storage_in_step(int kk, int layout) {
  const int c = 8 * (kk / 8) + 4 * ((kk % 8) & 1) + ((kk % 8) >> 1);  // 4:8 → 2:4
  if (layout == kActLayoutKMajor) return c;
  return 8 * ((c % 8) / 2) + (c & 1) + 2 * (c / 8);                   // B-fragment order
}

// Block-wide max of non-negative values (blockDim.x a multiple of 32, ≤ 1024).
__device__ __forceinline__ float block_max(float v, float* s_red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) s_red[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / 32) ? s_red[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // s_red reusable afterwards
  return v;
}

// A row value as fp32: bf16 bits or fp32 (the fp32-input quantizer of the W4A4 engine path).
__device__ __forceinline__ float row_value(const uint16_t* row, int k) { return bf16_bits_to_f32(row[k]); }
__device__ __forceinline__ float row_value(const float* row, int k) { return row[k]; }
__device__ __forceinline__ uint16_t row_bf16(const uint16_t* row, int k) { return row[k]; }
__device__ __forceinline__ uint16_t row_bf16(const float* row, int k) { return __bfloat16_as_ushort(__float2bfloat16_rn(row[k])); }

// One 32-wide k-step starting at logical column k0 of s_row → out[k0, k0+32) in layout kLayout, as
// four 16-byte stores. The layout is a template value so that every index into v[] is a compile-time
// constant and v stays in registers.
template <int kLayout, typename Row>
__device__ __forceinline__ void quantize_step(const Row* s_row, int k0, int K, bool quantize, float gamma,
                                              uint16_t* out) {
  uint16_t v[kActBlock];
  if (k0 >= K) {
#pragma unroll
    for (int j = 0; j < kActBlock; ++j) v[j] = 0;
  } else if (!quantize) {
#pragma unroll
    for (int j = 0; j < kActBlock; ++j) v[act_storage_in_step(j, kLayout)] = row_bf16(s_row, k0 + j);
  } else {
    float bmax = 0.0f;
#pragma unroll
    for (int j = 0; j < kActBlock; ++j) bmax = fmaxf(bmax, fabsf(row_value(s_row, k0 + j)));
    const float s = ue4m3_decode(ue4m3_encode(gamma * bmax / 6.0f));
    const float mult = s > 0.0f ? gamma / s : 0.0f;
#pragma unroll
    for (int j = 0; j < kActBlock; ++j) {
      const uint32_t q = s > 0.0f ? e2m1_encode(row_value(s_row, k0 + j) * mult) : 0u;
      // dec(q)·s has ≤ 6 significant bits: exact in bf16, so the truncating move below is exact.
      v[act_storage_in_step(j, kLayout)] = static_cast<uint16_t>(__float_as_uint(e2m1_decode(q) * s) >> 16);
    }
  }
  uint4* dst = reinterpret_cast<uint4*>(out + k0);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint4 p;
    p.x = v[8 * j + 0] | (static_cast<uint32_t>(v[8 * j + 1]) << 16);
    p.y = v[8 * j + 2] | (static_cast<uint32_t>(v[8 * j + 3]) << 16);
    p.z = v[8 * j + 4] | (static_cast<uint32_t>(v[8 * j + 5]) << 16);
    p.w = v[8 * j + 6] | (static_cast<uint32_t>(v[8 * j + 7]) << 16);
    dst[j] = p;
  }
}

// Row s_row [K] (bf16 bits or fp32, logical order, shared memory; fp32 rows are rounded to bf16
// only on the !quantize path) → out [K_pad] (global, 16-byte aligned) in
// the K order `layout` (kActLayoutMmaFragment or kActLayoutKMajor). Each thread owns whole 32-wide
// k-steps and writes one 16-byte store per 8 values in either layout: both only permute inside a step.
// quantize: NVFP4 decoded values dec(q)·dec(c) and *inv_scale = 1/γ_a; else the bf16 values and 1.
// All threads of the block must call it. s_red: 32 floats of shared scratch.
template <typename Row>
__device__ inline void quantize_row_to_kernel_layout(const Row* s_row, int K, int K_pad, bool quantize,
                                                     uint16_t* out, float* inv_scale, float* s_red, int layout) {
  float gamma = 1.0f;
  if (quantize) {
    float amax = 0.0f;
    for (int k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(row_value(s_row, k)));
    amax = block_max(amax, s_red);
    if (amax > 0.0f) {
      gamma = 2688.0f / amax;  // Eq. 5: 448·6 / amax
      if (!isfinite(gamma)) gamma = 1.0f;
    }
  }
  for (int step = threadIdx.x; step < K_pad / kActBlock; step += blockDim.x) {
    const int k0 = step * kActBlock;
    if (layout == kActLayoutKMajor) quantize_step<kActLayoutKMajor>(s_row, k0, K, quantize, gamma, out);
    else quantize_step<kActLayoutMmaFragment>(s_row, k0, K, quantize, gamma, out);
  }
  if (threadIdx.x == 0) *inv_scale = quantize ? 1.0f / gamma : 1.0f;
}

}  // namespace moesq::cuda::detail
