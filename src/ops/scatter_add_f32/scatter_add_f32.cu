// Kernel of the scatter_add_f32 launcher (scatter_add_f32.h): one CTA per source row.
#include "core/cuda/check.cuh"
#include "ops/scatter_add_f32/scatter_add_f32.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) scatter_add_kernel(ScatterAddF32Args a) {
  const int64_t i = blockIdx.x, r = a.idx[i];
  if (r < 0 || r >= a.y_rows) return;
  const float w = a.w[i];
  const float* s = a.src + i * a.C;
  float* y = a.y + r * a.C;
  for (int64_t c = threadIdx.x; c < a.C; c += kThreads) y[c] = __fadd_rn(y[c], __fmul_rn(w, s[c]));
}

}  // namespace

void scatter_add_f32(const ScatterAddF32Args& a, cudaStream_t stream) {
  scatter_add_f32_check(a);
  if (a.m == 0) return;
  MOESQ_CHECK(a.m <= 0x7fffffff, "scatter_add_f32: ", a.m, " rows exceed the grid");
  scatter_add_kernel<<<static_cast<unsigned>(a.m), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("scatter_add_f32");
}

}  // namespace moesq::ops
