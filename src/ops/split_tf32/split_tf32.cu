// Kernel of the split_tf32 launcher (split_tf32.h): a grid-stride loop, one value per thread.
#include <algorithm>

#include "core/cuda/check.cuh"
#include "ops/split_tf32/split_tf32.h"
#include "ops/split_tf32/tf32_round.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) split_kernel(SplitTf32Args a) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < a.n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    tf32_split(a.x[i], a.hi[i], a.lo[i]);
}

}  // namespace

void split_tf32(const SplitTf32Args& a, cudaStream_t stream) {
  split_tf32_check(a);
  if (a.n == 0) return;
  const int64_t ctas = std::min<int64_t>((a.n + kThreads - 1) / kThreads, 8192);
  split_kernel<<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("split_tf32");
}

}  // namespace moesq::ops
