// Dense-MLP SwiGLU kernel (dense_swiglu.h): one thread per element, grid-stride.
#include <cuda_bf16.h>

#include <algorithm>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/dense_swiglu/dense_swiglu.h"

namespace moesq::ops {

namespace {

__global__ void dense_swiglu_kernel(DenseSwigluArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  const int64_t n = a.T * a.I;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = k / a.I, i = k % a.I;
    const float* row = a.gu + t * a.ld;
    const float g = row[i], u = row[a.I + i];
    float v = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
    if (a.gated) v = __fmul_rn(v, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-row[2 * a.I]))));
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    a.a[k] = __bfloat16_as_ushort(hi);
    if (a.a_lo) a.a_lo[k] = __bfloat16_as_ushort(__float2bfloat16_rn(__fsub_rn(v, __bfloat162float(hi))));
  }
}

}  // namespace

void dense_swiglu(const DenseSwigluArgs& a, cudaStream_t stream) {
  dense_swiglu_check(a);
  if (a.T == 0) return;
  const int64_t n = a.T * a.I;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 4096));
  launch_pdl("dense_swiglu_kernel", dense_swiglu_kernel, dim3(blocks), dim3(256), 0, stream, a);
}

}  // namespace moesq::ops
