// RMSNorm kernel (rmsnorm.h): one CTA of 256 threads per row, fp64 tree reduction in a fixed order.
#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/rmsnorm/rmsnorm.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(RmsNormArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  __shared__ double s_part[kThreads];
  const float* xr = a.x + static_cast<int64_t>(blockIdx.x) * a.D;
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < a.D; i += kThreads)  // _rn: no fma contraction, as the CPU twin
    s = __dadd_rn(s, __dmul_rn(static_cast<double>(xr[i]), static_cast<double>(xr[i])));
  s_part[threadIdx.x] = s;
  __syncthreads();
  for (int h = kThreads / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) s_part[threadIdx.x] = __dadd_rn(s_part[threadIdx.x], s_part[threadIdx.x + h]);
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(s_part[0] / static_cast<double>(a.D) + a.eps));
  const int64_t row = static_cast<int64_t>(blockIdx.x) * a.D;
  for (int64_t i = threadIdx.x; i < a.D; i += kThreads) {  // each thread reads x[i] before writing i
    const float v = __fmul_rn(a.w[i], __fmul_rn(xr[i], inv));
    if (a.y_f32) a.y_f32[row + i] = v;
    if (!a.y) continue;
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    a.y[row + i] = __bfloat16_as_ushort(hi);
    if (a.y_lo) a.y_lo[row + i] = __bfloat16_as_ushort(__float2bfloat16_rn(__fsub_rn(v, __bfloat162float(hi))));
  }
}

}  // namespace

void rmsnorm(const RmsNormArgs& a, cudaStream_t stream) {
  MOESQ_CHECK(a.D > 0 && a.n >= 0, "rmsnorm: bad sizes n=", a.n, " D=", a.D);
  MOESQ_CHECK(a.y || a.y_f32, "rmsnorm: no output (y and y_f32 are null)");
  if (a.n == 0) return;
  launch_pdl("rmsnorm_kernel", rmsnorm_kernel, dim3(static_cast<unsigned>(a.n)), dim3(kThreads), 0, stream, a);
}

}  // namespace moesq::ops
