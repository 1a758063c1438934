// Kernel of the sgptq_columns launcher (sgptq_columns.h): one thread per row, 64 rows per CTA. The
// column loop is a long chain of dependent reads and writes of the row's block, so it runs out of
// shared memory: each CTA stages U's [nb, nb] block (a broadcast: every thread reads the same U_ij)
// and its rows' [nb] weights (column-major by thread, conflict-free), solves, and writes the weights
// back — 192 KiB for the default 128-column block. A block wider than kMaxSharedCols (a
// --block-size above 128) runs the same code on global memory instead.
#include <mutex>

#include "core/cuda/check.cuh"
#include "ops/sgptq_columns/sgptq_columns.h"
#include "ops/sgptq_columns/sgptq_row.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 64;            // rows per CTA: N = 768 → 12 CTAs per projection (experts run side by side)
constexpr int64_t kMaxSharedCols = 128;  // nb² + kThreads·nb doubles = 192 KiB at 128

size_t shared_bytes(int64_t nb) { return sizeof(double) * static_cast<size_t>(nb * nb + kThreads * nb); }

__global__ void __launch_bounds__(kThreads) sgptq_columns_shared(SgptqColumnsArgs a) {
  extern __shared__ double sm[];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + tid, nb = a.b1 - a.b0;
  double* su = sm;            // [nb, nb] U[b0:b1, b0:b1]
  double* sw = sm + nb * nb;  // [nb, kThreads] the CTA's rows, column j of thread t at j·kThreads + t
  for (int64_t idx = tid; idx < nb * nb; idx += kThreads) su[idx] = a.U[(a.b0 + idx / nb) * a.K + a.b0 + idx % nb];
  if (r < a.N)
    for (int64_t j = 0; j < nb; ++j) sw[j * kThreads + tid] = a.Wt[(a.b0 + j) * a.N + r];
  __syncthreads();
  if (r >= a.N) return;
  const sgptq_detail::RowBlock b{sw + tid, kThreads, su, nb, a.b0};
  if (!sgptq_detail::sgptq_row(a, r, b) && a.nonfinite) *a.nonfinite = 1;
  for (int64_t j = 0; j < nb; ++j) a.Wt[(a.b0 + j) * a.N + r] = sw[j * kThreads + tid];
}

__global__ void __launch_bounds__(kThreads) sgptq_columns_global(SgptqColumnsArgs a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (r >= a.N) return;
  const sgptq_detail::RowBlock b{a.Wt + r, a.N, a.U, a.K, 0};
  if (!sgptq_detail::sgptq_row(a, r, b) && a.nonfinite) *a.nonfinite = 1;
}

}  // namespace

void sgptq_columns(const SgptqColumnsArgs& a, cudaStream_t stream) {
  sgptq_columns_check(a);
  const int64_t ctas = (a.N + kThreads - 1) / kThreads, nb = a.b1 - a.b0;
  MOESQ_CHECK(ctas <= 0x7fffffff, "sgptq_columns: N=", a.N, " exceeds the grid");
  if (nb <= kMaxSharedCols) {
    static std::once_flag opt_in;
    std::call_once(opt_in, [] {
      MOESQ_CUDA_CHECK(cudaFuncSetAttribute(sgptq_columns_shared, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(shared_bytes(kMaxSharedCols))));
    });
    sgptq_columns_shared<<<static_cast<unsigned>(ctas), kThreads, shared_bytes(nb), stream>>>(a);
  } else {
    sgptq_columns_global<<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(a);
  }
  MOESQ_CUDA_LAUNCH_CHECK("sgptq_columns");
}

}  // namespace moesq::ops
