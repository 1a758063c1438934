// SwiGLU + requant kernel (swiglu_quant.h). One CTA per route (route grid) or per (expert, slot),
// where CTAs past the expert's device-side count exit at once; vector loads of the gate|up row, the
// quantizer of ops/common/nvfp4_row.cuh.
//
// Non-obvious decision: silu(g)·u is rounded to bf16 BEFORE quantization, exactly like the CPU
// reference and like an unfused bf16 pipeline would, so fusing changes no value; only expf's last
// ulp may differ from the host libm (the test allows that, and only that).
#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/common/nvfp4_row.cuh"
#include "ops/swiglu_quant/swiglu_quant.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) swiglu_quant_kernel(SwigluQuantArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  extern __shared__ __align__(16) unsigned char s_raw[];  // [I] bf16 silu(gate)·up, or fp32 (h_f32, quantize)
  uint16_t* s_row = reinterpret_cast<uint16_t*>(s_raw);
  float* s_rowf = reinterpret_cast<float*>(s_raw);
  __shared__ float s_red[32];
  int e, slot;
  if (a.slot_of_route) {  // grid: routes
    e = a.topk_ids[blockIdx.x], slot = a.slot_of_route[blockIdx.x];
    if (e < 0 || e >= a.num_experts || e < a.expert_begin || (a.expert_end >= 0 && e >= a.expert_end)) return;
    if (slot < 0 || slot >= min(a.counts[e], a.capacity)) return;
  } else {  // grid: (capacity, E)
    e = blockIdx.y, slot = blockIdx.x;
    if (slot >= min(a.counts[e], a.capacity)) return;
  }
  const int64_t s = static_cast<int64_t>(e) * a.capacity + slot;
  const bool f32_row = a.h_f32 && a.quantize;
  for (int64_t i = 4 * threadIdx.x; i < a.I; i += 4 * kThreads) {  // 4 columns per thread (I % 32 == 0)
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
                                          a.out + s * a.I_pad, a.inv_scale + s, s_red, static_cast<int>(a.layout), sg);
  else
    detail::quantize_row_to_kernel_layout(s_row, static_cast<int>(a.I), static_cast<int>(a.I_pad), a.quantize,
                                          a.out + s * a.I_pad, a.inv_scale + s, s_red, static_cast<int>(a.layout), sg);
}

}  // namespace

void swiglu_quant(const SwigluQuantArgs& a, cudaStream_t stream) {
  swiglu_quant_check(a);
  if (a.capacity == 0) return;
  const size_t smem = (a.h_f32 && a.quantize ? sizeof(float) : sizeof(uint16_t)) * a.I;
  if (smem > 48 * 1024)
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(swiglu_quant_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  if (a.slot_of_route) {
    if (a.routes == 0) return;
    launch_pdl("swiglu_quant_kernel", swiglu_quant_kernel, dim3(static_cast<unsigned>(a.routes)), dim3(kThreads),
               smem, stream, a);
  } else {
    launch_pdl("swiglu_quant_kernel", swiglu_quant_kernel, dim3(dim3(a.capacity, a.num_experts)), dim3(kThreads),
               smem, stream, a);
  }
  MOESQ_CUDA_LAUNCH_CHECK("swiglu_quant_kernel");
}

}  // namespace moesq::ops
