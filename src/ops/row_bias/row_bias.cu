// Row-bias kernel (row_bias.h): a grid-stride loop over the [rows, cols] values, one add each.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/row_bias/row_bias.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) row_bias_kernel(RowBiasArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  const int64_t n = a.rows * a.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    a.y[i] = __fadd_rn(a.y[i], a.bias[i % a.cols]);
}

}  // namespace

void row_bias(const RowBiasArgs& a, cudaStream_t stream) {
  row_bias_check(a);
  const int64_t n = a.rows * a.cols;
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 4096);
  launch_pdl("row_bias_kernel", row_bias_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, a);
}

}  // namespace moesq::ops
