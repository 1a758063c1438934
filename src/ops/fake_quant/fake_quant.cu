// Kernels of the fake_quant launcher (fake_quant.h). A tensor γ takes two passes (an amax reduction:
// block max, then an atomicMax on the fp32 bits — exact, order-free, since every value is >= 0 — then
// the quantization); a per-row γ is one CTA per row. Inside, each `block` values are `block` adjacent
// lanes of a warp: the block max is a shuffle reduction, then one value per lane through the
// codecs of ops/common/nvfp4_row.cuh, in format/nvfp4.cpp's fp32 order.
#include <cuda_bf16.h>

#include <cstdint>

#include "core/cuda/check.cuh"
#include "ops/common/nvfp4_row.cuh"
#include "ops/fake_quant/fake_quant.h"
#include "ops/fake_quant/fake_quant_device.cuh"

namespace moesq::ops {

namespace {

using detail::e2m1_decode;
using detail::e2m1_encode;
using detail::fake_quant_value;
using detail::flag_nonfinite;
using detail::tensor_scale;
using detail::ue4m3_decode;
using detail::ue4m3_encode;

constexpr int kThreads = 256;

// Four unscaled values as bf16 (exact: ≤ 6 significant bits) in one 8-byte store.
__device__ __forceinline__ void store_bf16x4(uint16_t* out, float4 u) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(u.x, u.y), hi = __floats2bfloat162_rn(u.z, u.w);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(out) = packed;
}

__global__ void __launch_bounds__(kThreads) amax_kernel(const float* x, int64_t n, float* amax, int32_t* nonfinite) {
  __shared__ float s_red[32];
  float m = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    flag_nonfinite(x[i], nonfinite);
    m = fmaxf(m, fabsf(x[i]));
  }
  m = detail::block_max(m, s_red);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned*>(amax), __float_as_uint(m));
}

// Four adjacent values per lane (one float4): a `block` shares its code across block/4 adjacent
// lanes, so the block max is the lane's own max of 4, then log2(block/4) shuffles — the same max and
// the same per-value arithmetic as fake_quant_value, in fewer instructions.
// *unscaled: the four values before the division by γ (fake_quant_value); !kDivide: only those (the
// returned values are not computed).
template <bool kDivide>
__device__ __forceinline__ float4 fake_quant_4(float4 v, float gamma, int block, float4* unscaled) {
  float bmax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  for (int o = block / 8; o > 0; o >>= 1) bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, o));
  const float s = ue4m3_decode(ue4m3_encode(gamma * bmax / 6.0f));
  *unscaled = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (!(s > 0.0f)) return *unscaled;
  const float mult = gamma / s;
  auto u = [&](float x) { return e2m1_decode(e2m1_encode(x * mult)) * s; };
  *unscaled = make_float4(u(v.x), u(v.y), u(v.z), u(v.w));
  if (!kDivide) return *unscaled;
  return make_float4(unscaled->x / gamma, unscaled->y / gamma, unscaled->z / gamma, unscaled->w / gamma);
}

// n % 32 == 0 (K % block == 0 and block | 32 … block is 16 or 32) and x 16-byte aligned: whole warps
// cover whole blocks, 4 values per lane.
template <bool kWriteX>
__global__ void __launch_bounds__(kThreads) tensor_quant_kernel(float* x, int64_t n, int block, const float* amax,
                                                                uint16_t* unscaled_bf16, float* gamma_out) {
  const float gamma = tensor_scale(*amax);
  if (gamma_out && blockIdx.x == 0 && threadIdx.x == 0) *gamma_out = gamma;
  float4* x4 = reinterpret_cast<float4*>(x);
  // The loop runs to whole warps (the shuffles need every lane); n/4 % 8 == 0, so a padded lane's
  // block is padding only and changes no real block's max.
  const int64_t n4 = n / 4, n4_warps = (n4 + 31) / 32 * 32;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n4_warps;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float4 u;
    const float4 q = fake_quant_4<kWriteX>(i < n4 ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f), gamma, block, &u);
    if (i < n4) {
      if (kWriteX) x4[i] = q;
      if (unscaled_bf16) store_bf16x4(unscaled_bf16 + 4 * i, u);
    }
  }
}

__global__ void __launch_bounds__(kThreads) row_quant_kernel(float* x, int64_t K, int block, int32_t* nonfinite,
                                                             uint16_t* unscaled_bf16, float* gamma_out) {
  __shared__ float s_red[32];
  float* row = x + static_cast<int64_t>(blockIdx.x) * K;
  detail::quantize_row_q_a(row, row, K, block, nonfinite,
                           unscaled_bf16 ? unscaled_bf16 + static_cast<int64_t>(blockIdx.x) * K : nullptr,
                           gamma_out ? gamma_out + blockIdx.x : nullptr, s_red);
}

}  // namespace

void fake_quant(const FakeQuantArgs& a, cudaStream_t stream) {
  fake_quant_check(a);
  const int64_t n = a.rows * a.K;
  if (n == 0) return;
  if (a.per_row) {
    row_quant_kernel<<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a.x, a.K, a.block, a.nonfinite,
                                                                             a.unscaled_bf16, a.gamma);
    MOESQ_CUDA_LAUNCH_CHECK("fake_quant (rows)");
    return;
  }
  MOESQ_CHECK(a.amax, "fake_quant: a tensor scale needs the amax scratch");
  MOESQ_CHECK(n % 32 == 0, "fake_quant: rows*K=", n, " must be a multiple of 32");
  MOESQ_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0, "fake_quant: x must be 16-byte aligned (a tensor scale)");
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  if (!a.amax_given) {
    MOESQ_CUDA_CHECK(cudaMemsetAsync(a.amax, 0, sizeof(float), stream));
    amax_kernel<<<blocks, kThreads, 0, stream>>>(a.x, n, a.amax, a.nonfinite);
    MOESQ_CUDA_LAUNCH_CHECK("fake_quant (amax)");
  }
  const unsigned blocks4 = static_cast<unsigned>(std::min<int64_t>((n / 4 + kThreads - 1) / kThreads, 4096));
  MOESQ_CHECK(reinterpret_cast<uintptr_t>(a.unscaled_bf16) % 8 == 0, "fake_quant: unscaled_bf16 must be 8-byte aligned");
  if (a.write_x)
    tensor_quant_kernel<true><<<blocks4, kThreads, 0, stream>>>(a.x, n, a.block, a.amax, a.unscaled_bf16, a.gamma);
  else
    tensor_quant_kernel<false><<<blocks4, kThreads, 0, stream>>>(a.x, n, a.block, a.amax, a.unscaled_bf16, a.gamma);
  MOESQ_CUDA_LAUNCH_CHECK("fake_quant (values)");
}

}  // namespace moesq::ops
