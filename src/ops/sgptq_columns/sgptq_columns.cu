// Kernel of the sgptq_columns launcher (sgptq_columns.h): one thread per row; a warp's rows are
// adjacent, so its reads and writes of Wt [K, N] (column j of 32 rows) are coalesced, and U's row
// is the same address for every thread (a broadcast).
#include "core/cuda/check.cuh"
#include "ops/sgptq_columns/sgptq_columns.h"
#include "ops/sgptq_columns/sgptq_row.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 64;  // rows per CTA: N = 768 → 12 CTAs per projection (experts run side by side)

__global__ void __launch_bounds__(kThreads) sgptq_columns_kernel(SgptqColumnsArgs a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (r >= a.N) return;
  if (!sgptq_detail::sgptq_row(a, r) && a.nonfinite) *a.nonfinite = 1;
}

}  // namespace

void sgptq_columns(const SgptqColumnsArgs& a, cudaStream_t stream) {
  sgptq_columns_check(a);
  const int64_t ctas = (a.N + kThreads - 1) / kThreads;
  MOESQ_CHECK(ctas <= 0x7fffffff, "sgptq_columns: N=", a.N, " exceeds the grid");
  sgptq_columns_kernel<<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("sgptq_columns");
}

}  // namespace moesq::ops
