// Activation dispatch + NVFP4 quantization kernel (act_dispatch.h). One CTA per route: claim a slot
// with one atomic, stage the token row in shared memory (16-byte loads), quantize it into the kernel
// layout (8 columns per thread, ops/common/nvfp4_row.cuh).
//
// Non-obvious decision: one CTA per ROUTE (not per token) re-reads a token row topk times, but keeps
// the per-token arithmetic independent of where its routes land; the row is tiny next to the
// expert weights the GEMM then streams, so the simpler mapping costs nothing measurable.
#include "ops/act_dispatch/act_dispatch.h"
#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/common/nvfp4_row.cuh"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;  // 8 columns per thread: K = 2048 in one pass

__global__ void __launch_bounds__(kThreads) act_dispatch_kernel(DispatchArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  extern __shared__ __align__(16) unsigned char s_raw[];  // [K] bf16 token row, or [K] fp32 (x_lo given)
  uint16_t* s_row = reinterpret_cast<uint16_t*>(s_raw);
  float* s_rowf = reinterpret_cast<float*>(s_raw);
  __shared__ float s_red[32];
  __shared__ int s_slot;
  const int64_t r = blockIdx.x;
  const int e = a.topk_ids[r];
  if (e < 0 || e >= a.num_experts) {  // invalid ids are the caller's bug; never write out of range
    if (threadIdx.x == 0 && a.slot_of_route) a.slot_of_route[r] = -1;
    return;
  }
  if (threadIdx.x == 0) s_slot = atomicAdd(&a.counts[e], 1);
  const uint16_t* src = a.x + (r / a.topk) * a.K;
  const bool f32 = a.x_lo != nullptr && a.quantize;
  const uint16_t* lo = f32 ? a.x_lo + (r / a.topk) * a.K : nullptr;
  for (int64_t k = 8 * threadIdx.x; k < a.K; k += 8 * kThreads) {  // 16-byte loads (K % 32 == 0)
    const uint4 p = *reinterpret_cast<const uint4*>(src + k);
    if (!f32) {
      *reinterpret_cast<uint4*>(s_row + k) = p;
      continue;
    }
    const uint4 q = *reinterpret_cast<const uint4*>(lo + k);
    const uint32_t hp[4] = {p.x, p.y, p.z, p.w}, lp[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 8; ++j)
      s_rowf[k + j] = __fadd_rn(detail::bf16_bits_to_f32(static_cast<uint16_t>(hp[j / 2] >> (16 * (j % 2)))),
                                detail::bf16_bits_to_f32(static_cast<uint16_t>(lp[j / 2] >> (16 * (j % 2)))));
  }
  __syncthreads();
  const int slot = s_slot;
  if (slot >= a.capacity) {  // dropped route: counted, not stored
    if (threadIdx.x == 0 && a.slot_of_route) a.slot_of_route[r] = -1;
    return;
  }
  const int64_t s = static_cast<int64_t>(e) * a.capacity + slot;
  if (threadIdx.x == 0) {
    a.route_of_slot[s] = static_cast<int32_t>(r);
    if (a.slot_of_route) a.slot_of_route[r] = slot;
  }
  const float g = a.act_gamma ? a.act_gamma[e] : 0.0f;  // > 0: the expert's static γ_a
  if (f32)
    detail::quantize_row_to_kernel_layout(s_rowf, static_cast<int>(a.K), static_cast<int>(a.K_pad), true,
                                          a.out + s * a.K_pad, a.inv_scale + s, s_red, static_cast<int>(a.layout), g);
  else
    detail::quantize_row_to_kernel_layout(s_row, static_cast<int>(a.K), static_cast<int>(a.K_pad), a.quantize,
                                          a.out + s * a.K_pad, a.inv_scale + s, s_red, static_cast<int>(a.layout), g);
}

}  // namespace

void act_dispatch(const DispatchArgs& a, cudaStream_t stream) {
  act_dispatch_check(a);
  if (!a.counts_zeroed) MOESQ_CUDA_CHECK(cudaMemsetAsync(a.counts, 0, sizeof(int32_t) * a.num_experts, stream));
  if (a.T == 0) return;
  const size_t smem = (a.x_lo && a.quantize ? sizeof(float) : sizeof(uint16_t)) * a.K;
  if (smem > 48 * 1024)
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(act_dispatch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  launch_pdl("act_dispatch_kernel", act_dispatch_kernel, dim3(static_cast<unsigned>(a.T * a.topk)), dim3(kThreads),
             smem, stream, a);
}

}  // namespace moesq::ops
