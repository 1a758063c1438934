// Router softmax + top-k kernel (router_topk.h): one warp per token, probabilities in shared memory.
#include "core/cuda/check.cuh"
#include "ops/router_topk/router_topk.h"

namespace moesq::ops {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxExperts = 512;

__global__ void __launch_bounds__(kWarps * 32) router_topk_kernel(RouterTopkArgs a) {
  __shared__ float s_p[kWarps][kMaxExperts];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (t >= a.T) return;
  const int E = a.num_experts;
  const float* z = a.logits + t * E;
  float* p = s_p[warp];
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, z[e]);
  for (int x = 16; x > 0; x /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
  float s = 0.0f;
  for (int e = lane; e < E; e += 32) s = __fadd_rn(s, p[e] = expf(__fsub_rn(z[e], mx)));
  for (int h = 1; h < 32; h *= 2) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, h));
  for (int e = lane; e < E; e += 32) p[e] = __fdiv_rn(p[e], s);
  __syncwarp();
  float wsum = 0.0f, w_mine = 0.0f;
  for (int j = 0; j < a.topk; ++j) {
    float bv = -1.0f;
    int bi = E;
    for (int e = lane; e < E; e += 32)
      if (p[e] > bv) bv = p[e], bi = e;  // ascending e per lane: first max = lowest id
    for (int x = 16; x > 0; x /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, x);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, x);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    wsum = __fadd_rn(wsum, bv);
    if (lane == j) w_mine = bv;
    if (lane == 0) a.topk_ids[t * a.topk + j] = bi;
    __syncwarp();
    if (lane == 0) p[bi] = -2.0f;  // taken
    __syncwarp();
  }
  if (lane < a.topk) a.topk_w[t * a.topk + lane] = a.norm_topk_prob ? __fdiv_rn(w_mine, wsum) : w_mine;
}

}  // namespace

void router_topk(const RouterTopkArgs& a, cudaStream_t stream) {
  router_topk_check(a);
  if (a.T == 0) return;
  router_topk_kernel<<<static_cast<unsigned>((a.T + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("router_topk_kernel");
}

}  // namespace moesq::ops
