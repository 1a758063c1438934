// Router softmax / sigmoid + grouped top-k kernel (router_topk.h): one warp per token, scores in shared memory.
#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/router_topk/router_topk.h"
#include "ops/router_topk/router_topk_token.cuh"

namespace moesq::ops {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxExperts = detail::kRouterTopkMaxExperts;

__global__ void __launch_bounds__(kWarps * 32) router_topk_kernel(RouterTopkArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  if (a.counts && blockIdx.x == 0)
    for (int e = threadIdx.x; e < a.num_experts; e += blockDim.x) a.counts[e] = 0;
  __shared__ float s_p[kWarps][kMaxExperts];
  __shared__ float s_c[kWarps][kMaxExperts];  // sigmoid: the choice scores
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (t >= a.T) return;
  detail::router_topk_token(a, t, s_p[warp], s_c[warp], lane);
}

}  // namespace

void router_topk(const RouterTopkArgs& a, cudaStream_t stream) {
  router_topk_check(a);
  if (a.T == 0) return;
  launch_pdl("router_topk_kernel", router_topk_kernel, dim3(static_cast<unsigned>((a.T + kWarps - 1) / kWarps)),
             dim3(kWarps * 32), 0, stream, a);
}

}  // namespace moesq::ops
