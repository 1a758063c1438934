// Kernel of the gather_f32 launcher (gather_f32.h): one CTA per output row.
#include "core/cuda/check.cuh"
#include "ops/gather_f32/gather_f32.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) gather_kernel(GatherF32Args a) {
  const int64_t i = blockIdx.x, r = a.idx[i];
  const bool in = r >= 0 && r < a.src_rows;
  float* out = a.out + i * a.C;
  const float* src = a.src + (in ? r : 0) * a.C;
  for (int64_t c = threadIdx.x; c < a.C; c += kThreads) out[c] = in ? src[c] : 0.0f;
}

}  // namespace

void gather_f32(const GatherF32Args& a, cudaStream_t stream) {
  gather_f32_check(a);
  if (a.m == 0) return;
  MOESQ_CHECK(a.m <= 0x7fffffff, "gather_f32: ", a.m, " rows exceed the grid");
  gather_kernel<<<static_cast<unsigned>(a.m), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gather_f32");
}

}  // namespace moesq::ops
