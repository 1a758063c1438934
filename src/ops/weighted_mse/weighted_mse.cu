// Kernel of the weighted_mse launcher (weighted_mse.h): one CTA per row; the row's Σ r² is a fixed
// tree (per-thread strided partials, then a shared-memory tree), so it is the same bits every run.
#include "core/cuda/check.cuh"
#include "ops/descale_rows/descale_rows.h"
#include "ops/weighted_mse/weighted_mse.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) mse_kernel(WeightedMseArgs a) {
  __shared__ double s_sum[kThreads];
  const int64_t i = blockIdx.x;
  const float coef = static_cast<float>(2.0 * a.w[i] * a.inv_norm);
  const float gr = a.y_gamma ? a.y_row_gamma[i] : 1.0f, g = a.y_gamma ? *a.y_gamma : 1.0f;
  double part = 0.0;
  for (int64_t o = threadIdx.x; o < a.H; o += kThreads) {
    const float yv = a.y_gamma ? descale_value(a.y[i * a.H + o], gr, g) : a.y[i * a.H + o];
    const float r = yv - a.y_ref[i * a.H + o];
    part += static_cast<double>(r) * r;
    if (a.dy) a.dy[i * a.H + o] = coef * r;
  }
  if (!a.row_loss) return;
  s_sum[threadIdx.x] = part;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) s_sum[threadIdx.x] += s_sum[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) a.row_loss[i] = a.w[i] * s_sum[0];
}

}  // namespace

void weighted_mse(const WeightedMseArgs& a, cudaStream_t stream) {
  weighted_mse_check(a);
  if (a.rows == 0) return;
  MOESQ_CHECK(a.rows <= 0x7fffffff, "weighted_mse: ", a.rows, " rows exceed the grid");
  mse_kernel<<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("weighted_mse");
}

}  // namespace moesq::ops
