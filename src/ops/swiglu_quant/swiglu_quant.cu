// SwiGLU + requant kernel (swiglu_quant.h). One CTA per route (route grid) or per (expert, slot),
// where CTAs past the expert's device-side count exit at once; the row's work is swiglu_row.cuh's.
#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/swiglu_quant/swiglu_quant.h"
#include "ops/swiglu_quant/swiglu_row.cuh"

namespace moesq::ops {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) swiglu_quant_kernel(SwigluQuantArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  extern __shared__ __align__(16) unsigned char s_raw[];  // [I] bf16 silu(gate)·up, or fp32 (h_f32, quantize)
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
  detail::swiglu_quant_row(a, e, s, s_raw, s_red, a.out + s * a.I_pad, a.inv_scale + s);
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
}

}  // namespace moesq::ops
