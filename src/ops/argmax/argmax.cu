// Row argmax kernel (argmax.h): one CTA of 256 threads per row; each thread scans a strided slice
// keeping its first maximum, then a shared-memory tree keeps the larger value, the lower id on ties.
#include <cuda_runtime.h>

#include <cmath>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/argmax/argmax.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void argmax_kernel(const float* logits, int64_t V, int32_t* next) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  __shared__ float s_v[kThreads];
  __shared__ int32_t s_i[kThreads];
  const float* z = logits + static_cast<int64_t>(blockIdx.x) * V;
  float bv = -INFINITY;
  int32_t bi = 0x7fffffff;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    if (z[v] > bv) bv = z[v], bi = static_cast<int32_t>(v);
  s_v[threadIdx.x] = bv, s_i[threadIdx.x] = bi;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) {
      const float ov = s_v[threadIdx.x + h];
      const int32_t oi = s_i[threadIdx.x + h];
      if (ov > s_v[threadIdx.x] || (ov == s_v[threadIdx.x] && oi < s_i[threadIdx.x]))
        s_v[threadIdx.x] = ov, s_i[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) next[blockIdx.x] = s_i[0] == 0x7fffffff ? 0 : s_i[0];
}

}  // namespace

void argmax(const ArgmaxArgs& a, cudaStream_t stream) {
  launch_pdl("argmax_kernel", argmax_kernel, dim3(static_cast<unsigned>(a.n)), dim3(kThreads), 0, stream, a.logits,
             a.V, a.out);
}

}  // namespace moesq::ops
