// Device helpers shared by the two activation-producing kernels (act_dispatch.cu, swiglu_quant.cu):
// NVFP4 quantization of one row held in shared memory, written in the K order of the GEMM kernel
// that reads it (format/kernel_layout.h ActLayout, act_storage_index). CPU twin: ops::act_quant_row_ref.
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

namespace moesq::ops::detail {

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

// Activation layouts as ints, equal to format::ActLayout's values (kernel_layout.h; the launchers
// static_assert it), so this header stays free of host-library includes.
constexpr int kActLayoutMmaFragment = 0;  // 4:8 → 2:4, then B-fragment order (mma.sp kernel)
constexpr int kActLayoutKMajor = 1;       // 4:8 → 2:4 only (wgmma.sp kernel, K-major smem B tile)
static_assert(static_cast<int>(format::ActLayout::kMmaFragment) == kActLayoutMmaFragment &&
                  static_cast<int>(format::ActLayout::kKMajor) == kActLayoutKMajor,
              "the device layout ints must equal format::ActLayout");

// Storage index of logical column kk (0..31) inside its 32-wide k-step in `layout`
// (format::act_storage_index, kernel_layout.cpp).
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

// The 8 values of logical columns [k0, k0 + 8) of a shared-memory row as fp32 (b: their bf16 bits,
// exact for bf16 rows, RNE-rounded for fp32 rows). 16-byte aligned vector reads.
__device__ __forceinline__ void load8(const uint16_t* row, int k0, float (&f)[8], uint16_t (&b)[8]) {
  const uint4 p = *reinterpret_cast<const uint4*>(row + k0);
  const uint32_t w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    b[j] = static_cast<uint16_t>(w[j / 2] >> (16 * (j % 2)));
    f[j] = bf16_bits_to_f32(b[j]);
  }
}
__device__ __forceinline__ void load8(const float* row, int k0, float (&f)[8], uint16_t (&b)[8]) {
  const float4 p = *reinterpret_cast<const float4*>(row + k0), q = *reinterpret_cast<const float4*>(row + k0 + 4);
  f[0] = p.x, f[1] = p.y, f[2] = p.z, f[3] = p.w, f[4] = q.x, f[5] = q.y, f[6] = q.z, f[7] = q.w;
#pragma unroll
  for (int j = 0; j < 8; ++j) b[j] = __bfloat16_as_ushort(__float2bfloat16_rn(f[j]));
}

// w[i] of i = sel (0..3) without dynamic register indexing.
__device__ __forceinline__ uint32_t pick4(const uint32_t (&w)[4], int sel) {
  return sel == 0 ? w[0] : sel == 1 ? w[1] : sel == 2 ? w[2] : w[3];
}

// Row s_row [K] (bf16 bits or fp32, logical order, shared memory; fp32 rows are rounded to bf16
// only on the !quantize path) → out [K_pad] (global, 16-byte aligned) in the K order `layout`
// (kActLayoutMmaFragment or kActLayoutKMajor). quantize: NVFP4 decoded values dec(q)·dec(c) and
// *inv_scale = 1/γ_a, with γ_a = 448·6/amax(row) (Eq. 5), or `static_gamma` when > 0 (a checkpoint's
// stored input_global_scale; must be the same in every thread of the block); else the bf16 values and 1. All threads of the block must call it (blockDim.x a
// multiple of 32); K % 32 == 0, K_pad % 256 == 0. s_red: 32 floats of shared scratch.
//
// Each thread owns 8 consecutive logical columns (a quarter of a 32-wide scale block: the four
// quarters sit in 4 adjacent lanes, whose block max is two shuffles). Within a quarter, the 4:8 → 2:4
// step pairs columns (0,2) (4,6) (1,3) (5,7) into 32-bit words w0..w3; kKMajor stores the quarter's
// own words, kMmaFragment stores, for quarter g, word g of each of the 4 quarters (a 4×4 word
// transpose over the 4 lanes) — act_storage_in_step for every column, one 16-byte store per thread.
template <typename Row>
__device__ inline void quantize_row_to_kernel_layout(const Row* s_row, int K, int K_pad, bool quantize,
                                                     uint16_t* out, float* inv_scale, float* s_red, int layout,
                                                     float static_gamma = 0.0f) {
  float gamma = 1.0f;
  if (quantize && static_gamma > 0.0f) {
    gamma = static_gamma;
  } else if (quantize) {
    float amax = 0.0f;
    for (int k0 = 8 * static_cast<int>(threadIdx.x); k0 < K; k0 += 8 * static_cast<int>(blockDim.x)) {
      float f[8];
      uint16_t b[8];
      load8(s_row, k0, f, b);
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
    }
    amax = block_max(amax, s_red);
    if (amax > 0.0f) {
      gamma = 2688.0f / amax;  // Eq. 5: 448·6 / amax
      if (!isfinite(gamma)) gamma = 1.0f;
    }
  }
  const int lane = threadIdx.x % 32, quarter = lane % 4, base = lane - quarter;
  // K_pad / 8 is a multiple of 32: every pass of the loop runs whole warps (the shuffles need them).
  for (int k0 = 8 * static_cast<int>(threadIdx.x); k0 < K_pad; k0 += 8 * static_cast<int>(blockDim.x)) {
    const bool in = k0 < K;  // K % 32 == 0: the 4 quarters of a block agree
    float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint16_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (in) load8(s_row, k0, f, v);
    if (quantize) {
      float bmax = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) bmax = fmaxf(bmax, fabsf(f[j]));
      bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, 1));
      bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, 2));
      const float s = ue4m3_decode(ue4m3_encode(gamma * bmax / 6.0f));
      const float mult = s > 0.0f ? gamma / s : 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t q = s > 0.0f ? e2m1_encode(f[j] * mult) : 0u;
        // dec(q)·s has ≤ 6 significant bits: exact in bf16, so the truncating move below is exact.
        v[j] = in ? static_cast<uint16_t>(__float_as_uint(e2m1_decode(q) * s) >> 16) : 0;
      }
    }
    const uint32_t w[4] = {v[0] | (static_cast<uint32_t>(v[2]) << 16), v[4] | (static_cast<uint32_t>(v[6]) << 16),
                           v[1] | (static_cast<uint32_t>(v[3]) << 16), v[5] | (static_cast<uint32_t>(v[7]) << 16)};
    uint4 p;
    if (layout == kActLayoutKMajor) {
      p = make_uint4(w[0], w[1], w[2], w[3]);
    } else {  // out word i = word `quarter` of quarter i; the lane of quarter ^ d sends its word[quarter]
      uint32_t got[4];  // got[d]: from quarter ^ d
      got[0] = pick4(w, quarter);
#pragma unroll
      for (int d = 1; d < 4; ++d) got[d] = __shfl_sync(0xffffffffu, pick4(w, quarter ^ d), base + (quarter ^ d));
      p = make_uint4(pick4(got, quarter), pick4(got, 1 ^ quarter), pick4(got, 2 ^ quarter), pick4(got, 3 ^ quarter));
    }
    *reinterpret_cast<uint4*>(out + k0) = p;
  }
  if (threadIdx.x == 0) *inv_scale = quantize ? 1.0f / gamma : 1.0f;
}

}  // namespace moesq::ops::detail
