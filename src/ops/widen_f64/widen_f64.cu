// Kernel of the widen_f64 launcher (widen_f64.h): a grid-stride loop over the elements.
#include <algorithm>

#include "core/cuda/check.cuh"
#include "ops/widen_f64/widen_f64.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) widen_kernel(WidenF64Args a) {
  const int64_t n = a.rows * a.K;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t t = i / a.K;
    const double s = a.w ? sqrt(static_cast<double>(a.w[t])) : 1.0;
    a.out[i] = s * static_cast<double>(a.x[i]);
  }
}

}  // namespace

void widen_f64(const WidenF64Args& a, cudaStream_t stream) {
  widen_f64_check(a);
  const int64_t n = a.rows * a.K;
  if (n == 0) return;
  const int64_t ctas = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  widen_kernel<<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("widen_f64");
}

}  // namespace moesq::ops
