// Kernel of the descale_rows launcher (descale_rows.h): elementwise, one row per grid-stride step of
// the row index, the row's γ read once per thread.
#include <algorithm>

#include "core/cuda/check.cuh"
#include "ops/descale_rows/descale_rows.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) descale_kernel(float* x, int64_t rows, int64_t C, const float* row_gamma,
                                                           const float* gamma) {
  const float g = *gamma;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float gr = row_gamma[r];
    float* row = x + r * C;
    for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < C;
         c += static_cast<int64_t>(gridDim.x) * kThreads)
      row[c] = descale_value(row[c], gr, g);  // IEEE divisions (no fast math in this build)
  }
}

}  // namespace

void descale_rows(const DescaleRowsArgs& a, cudaStream_t stream) {
  descale_rows_check(a);
  if (a.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((a.C + kThreads - 1) / kThreads, 64)),
                  static_cast<unsigned>(std::min<int64_t>(a.rows, 65535)));
  descale_kernel<<<grid, kThreads, 0, stream>>>(a.x, a.rows, a.C, a.row_gamma, a.gamma);
  MOESQ_CUDA_LAUNCH_CHECK("descale_rows");
}

}  // namespace moesq::ops
