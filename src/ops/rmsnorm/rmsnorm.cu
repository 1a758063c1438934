// RMSNorm kernel (rmsnorm.h): one CTA of 256 threads per row, fp64 tree reduction in a fixed order
// (rmsnorm_row.cuh, shared with moe_combine's fused norm).
#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/rmsnorm/rmsnorm.h"
#include "ops/rmsnorm/rmsnorm_row.cuh"

namespace moesq::ops {

namespace {

constexpr int kThreads = detail::kRmsNormThreads;

__global__ void __launch_bounds__(kThreads) rmsnorm_kernel(RmsNormArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  __shared__ double s_part[kThreads];
  detail::rmsnorm_row(a, blockIdx.x, s_part);
}

}  // namespace

void rmsnorm(const RmsNormArgs& a, cudaStream_t stream) {
  MOESQ_CHECK(a.D > 0 && a.n >= 0, "rmsnorm: bad sizes n=", a.n, " D=", a.D);
  MOESQ_CHECK(a.y || a.y_f32, "rmsnorm: no output (y and y_f32 are null)");
  if (a.n == 0) return;
  launch_pdl("rmsnorm_kernel", rmsnorm_kernel, dim3(static_cast<unsigned>(a.n)), dim3(kThreads), 0, stream, a);
}

}  // namespace moesq::ops
