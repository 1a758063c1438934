// Combine kernels (moe_combine.h): invert route_of_slot, then one CTA per token sums its k routes
// in ascending expert id (a k-element insertion sort per thread) into the residual.
#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "ops/moe_combine/moe_combine.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxTopk = 32;

__global__ void fill_kernel(int32_t* p, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = -1;
}

__global__ void invert_kernel(MoeCombineArgs a) {  // grid: E blocks
  const int e = blockIdx.x;
  const int n = min(max(a.counts[e], 0), a.capacity);
  for (int s = threadIdx.x; s < n; s += blockDim.x)
    a.slot_of_route[a.route_of_slot[static_cast<int64_t>(e) * a.capacity + s]] = s;
}

__global__ void __launch_bounds__(kThreads) combine_kernel(MoeCombineArgs a) {
  __shared__ int s_order[kMaxTopk];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    for (int j = 0; j < a.topk; ++j) {
      int i = j;
      while (i > 0 && a.topk_ids[t * a.topk + s_order[i - 1]] > a.topk_ids[t * a.topk + j]) {
        s_order[i] = s_order[i - 1];
        --i;
      }
      s_order[i] = j;
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < a.H; c += kThreads) {
    float acc = 0.0f;
    for (int q = 0; q < a.topk; ++q) {
      const int64_t r = t * a.topk + s_order[q];
      const int s = a.slot_of_route[r];
      if (s < 0) continue;
      const int64_t e = a.topk_ids[r];
      const float o = __bfloat162float(__ushort_as_bfloat16(a.y[(e * a.capacity + s) * a.ldy + c]));
      acc = __fadd_rn(acc, __fmul_rn(o, a.topk_w[r]));
    }
    a.h[t * a.H + c] = __fadd_rn(a.h[t * a.H + c], acc);
  }
}

}  // namespace

void moe_combine(const MoeCombineArgs& a, cudaStream_t stream) {
  moe_combine_check(a);
  if (a.T == 0) return;
  const int64_t routes = a.T * a.topk;
  fill_kernel<<<static_cast<unsigned>((routes + 255) / 256), 256, 0, stream>>>(a.slot_of_route, routes);
  invert_kernel<<<a.num_experts, 256, 0, stream>>>(a);
  combine_kernel<<<static_cast<unsigned>(a.T), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("moe_combine");
}

}  // namespace moesq::ops
