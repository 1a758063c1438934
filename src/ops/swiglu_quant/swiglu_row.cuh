// One routed row of SwiGLU + requant on one CTA (every thread of it calls): the body of swiglu_quant's
// kernel (swiglu_quant.cu), shared with the grouped sparse GEMM's routes kernel, which runs it in front
// of the down GEMM at decode sizes (ops/sparse_gemm/sparse_gemm_routes.cu): one arithmetic, one set of bits.
//
// Non-obvious decision: silu(g)·u is rounded to bf16 BEFORE quantization, exactly like the CPU
// reference and like an unfused bf16 pipeline would, so fusing changes no value; only expf's last
// ulp may differ from the host libm (the test allows that, and only that).
#pragma once
#include <cuda_bf16.h>

#include "ops/common/nvfp4_row.cuh"
#include "ops/swiglu_quant/swiglu_quant.h"

namespace moesq::ops::detail {

// Row s = e·capacity + slot of a.h / a.h_f32 (expert e: its biases and static γ_a) → out [I_pad] bf16 in
// a.layout's K order and *inv_scale (global or shared memory). s_raw: [I] scratch in shared memory,
// fp32 (h_f32 with quantize) or bf16; s_red: [32] fp32 shared.
// The caller synchronizes the CTA before it reuses s_raw or reads out.
__device__ inline void swiglu_quant_row(const SwigluQuantArgs& a, int e, int64_t s, unsigned char* s_raw, float* s_red,
                                        uint16_t* out, float* inv_scale) {
  uint16_t* s_row = reinterpret_cast<uint16_t*>(s_raw);
  float* s_rowf = reinterpret_cast<float*>(s_raw);
  constexpr int kStride = 4;  // columns per thread per pass
  const bool f32_row = a.h_f32 && a.quantize;
  for (int64_t i = kStride * threadIdx.x; i < a.I; i += kStride * blockDim.x) {  // I % 32 == 0
    float g[4], u[4];
    if (a.h_f32) {
      const float* h = a.h_f32 + s * 2 * a.I;
      const float4 gv = *reinterpret_cast<const float4*>(h + i), uv = *reinterpret_cast<const float4*>(h + a.I + i);
      g[0] = gv.x, g[1] = gv.y, g[2] = gv.z, g[3] = gv.w, u[0] = uv.x, u[1] = uv.y, u[2] = uv.z, u[3] = uv.w;
    } else {
      const uint16_t* h = a.h + s * 2 * a.I;
      const uint2 gv = *reinterpret_cast<const uint2*>(h + i), uv = *reinterpret_cast<const uint2*>(h + a.I + i);
      const uint32_t gw[2] = {gv.x, gv.y}, uw[2] = {uv.x, uv.y};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        g[j] = detail::bf16_bits_to_f32(static_cast<uint16_t>(gw[j / 2] >> (16 * (j % 2))));
        u[j] = detail::bf16_bits_to_f32(static_cast<uint16_t>(uw[j / 2] >> (16 * (j % 2))));
      }
    }
    if (a.gate_up_bias) {
      const float* b = a.gate_up_bias + static_cast<int64_t>(e) * 2 * a.I;
#pragma unroll
      for (int j = 0; j < 4; ++j) g[j] = __fadd_rn(g[j], b[i + j]), u[j] = __fadd_rn(u[j], b[a.I + i + j]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float y;
      if (a.clamped) {  // core/swiglu.h clamped_swiglu, its fp32 order
        const float gc = fminf(g[j], a.limit), uc = fminf(fmaxf(u[j], -a.limit), a.limit);
        const float sg = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(gc, a.alpha))));
        y = __fmul_rn(__fadd_rn(uc, 1.0f), __fmul_rn(gc, sg));
      } else {
        y = g[j] / (1.0f + expf(-g[j])) * u[j];
      }
      if (f32_row) s_rowf[i + j] = y;
      else s_row[i + j] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
    }
  }
  __syncthreads();
  const float sg = a.act_gamma ? a.act_gamma[e] : 0.0f;  // > 0: the expert's static γ_a
  if (f32_row)
    detail::quantize_row_to_kernel_layout(s_rowf, static_cast<int>(a.I), static_cast<int>(a.I_pad), true,
                                          out, inv_scale, s_red, static_cast<int>(a.layout), sg);
  else
    detail::quantize_row_to_kernel_layout(s_row, static_cast<int>(a.I), static_cast<int>(a.I_pad), a.quantize,
                                          out, inv_scale, s_red, static_cast<int>(a.layout), sg);
}

}  // namespace moesq::ops::detail
