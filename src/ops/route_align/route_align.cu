// Native route alignment on the device (see route_align.h): one thread per route claims its slot in its
// expert's region with atomicAdd (vLLM moe_align_block_size's scatter). Non-obvious: region sizes and
// padding come from the CPU canonical alignment (they are the same for every order); only the order
// inside an expert is the device's.
#include "core/cuda/dev_buf.cuh"
#include "ops/route_align/route_align.h"

namespace moesq::ops {

namespace {

__global__ void align_scatter_kernel(const int32_t* topk_ids, int64_t R, const int32_t* expert_offset,
                                     int32_t* cursor, int32_t* sorted_ids) {
  const int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (r >= R) return;
  const int32_t e = topk_ids[r];
  const int32_t slot = atomicAdd(&cursor[e], 1);  // the order inside an expert = atomic order
  sorted_ids[expert_offset[e] + slot] = static_cast<int32_t>(r);
}

}  // namespace

ops::RouteAlignment align_routes_cuda(const std::vector<int32_t>& topk_ids, int64_t M, int topk, int num_experts,
                                      int block_size) {
  // Region sizes are the same for every order; the scatter order is the device's.
  ops::RouteAlignment a = ops::align_routes(topk_ids, M, topk, num_experts, block_size, ops::AlignOrder::Canonical);
  std::vector<int32_t> offset(num_experts, 0);
  for (int64_t p = a.num_blocks() - 1; p >= 0; --p) offset[a.block_expert[p]] = static_cast<int32_t>(p * block_size);
  const int64_t R = M * topk;
  DevBuf<int32_t> d_ids(topk_ids.data(), topk_ids.size()), d_off(offset.data(), offset.size()),
      d_cursor(num_experts), d_sorted(a.sorted_ids.data(), a.sorted_ids.size());
  MOESQ_CUDA_CHECK(cudaMemset(d_cursor.p, 0, num_experts * sizeof(int32_t)));
  if (R > 0) {
    align_scatter_kernel<<<static_cast<unsigned>((R + 63) / 64), 64>>>(d_ids.p, R, d_off.p, d_cursor.p, d_sorted.p);
    MOESQ_CUDA_LAUNCH_CHECK("align_scatter_kernel");
  }
  MOESQ_CUDA_CHECK(cudaMemcpy(a.sorted_ids.data(), d_sorted.p, a.sorted_ids.size() * 4, cudaMemcpyDeviceToHost));
  return a;
}

}  // namespace moesq::ops
