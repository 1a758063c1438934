// Row argmax kernel (argmax.h): one CTA of 1024 threads per row; each thread scans a strided slice
// (float4 loads, 4 in flight) keeping its first maximum, then a shared-memory tree keeps the larger
// value, the lower id on ties.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/argmax/argmax.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 1024;  // one CTA per row: a decode step's rows are few and V is ~150k
constexpr int kUnroll = 4;      // float4 loads in flight per thread

// v[i] > best: take it (strict, so a thread keeps its first maximum: its indices only increase).
__device__ __forceinline__ void take(float v, int64_t i, float& bv, int32_t& bi) {
  if (v > bv) bv = v, bi = static_cast<int32_t>(i);
}

__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* logits, int64_t V, int32_t* next) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  __shared__ float s_v[kThreads];
  __shared__ int32_t s_i[kThreads];
  const float* z = logits + static_cast<int64_t>(blockIdx.x) * V;
  float bv = -INFINITY;
  int32_t bi = 0x7fffffff;
  const int64_t bd = blockDim.x;
  if (V % 4 == 0 && reinterpret_cast<uintptr_t>(z) % 16 == 0) {
    // float4 loads, kUnroll of them issued before the first compare (a dependent load per element
    // made the row a latency chain: 237 µs for 151,936 logits on one SM, bench/NOTES.md session 28).
    const float4* z4 = reinterpret_cast<const float4*>(z);
    const int64_t nq = V / 4;
    for (int64_t q = threadIdx.x; q < nq; q += kUnroll * bd) {
      float4 f[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        f[u] = q + u * bd < nq ? z4[q + u * bd] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = 4 * (q + u * bd);
        take(f[u].x, i, bv, bi), take(f[u].y, i + 1, bv, bi);
        take(f[u].z, i + 2, bv, bi), take(f[u].w, i + 3, bv, bi);
      }
    }
  } else {
    for (int64_t v = threadIdx.x; v < V; v += bd) take(z[v], v, bv, bi);
  }
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
