// Kernel of the route_rows launcher (route_rows.h): one CTA per route row, 32-bit words (H and ldy are
// even, so a row is whole words and a word never straddles two rows).
#include <algorithm>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/route_rows/route_rows.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) route_rows_kernel(RouteRowsArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  const int64_t q = blockIdx.x;
  const int32_t e = a.topk_ids[q], s = a.slot_of_route[q];
  const bool kept = s >= 0 && s < a.capacity && e >= 0 && e < a.num_experts;
  const int64_t words = a.H / 2;
  uint32_t* row = reinterpret_cast<uint32_t*>(a.routes + q * a.H);
  uint32_t* yrow = kept ? reinterpret_cast<uint32_t*>(a.y + (static_cast<int64_t>(e) * a.capacity + s) * a.ldy) : nullptr;
  if (a.pack) {
    const bool mine = kept && e >= a.expert_begin && e < a.expert_end;
    for (int64_t w = threadIdx.x; w < words; w += kThreads) row[w] = mine ? yrow[w] : 0u;
  } else if (kept) {
    for (int64_t w = threadIdx.x; w < words; w += kThreads) yrow[w] = row[w];
  }
}

}  // namespace

void route_rows(const RouteRowsArgs& a, cudaStream_t stream) {
  route_rows_check(a);
  const int64_t rows = a.T * a.topk;
  if (rows == 0) return;
  MOESQ_CHECK(rows <= 0x7fffffff, "route_rows: ", rows, " routes exceed the grid");
  launch_pdl("route_rows_kernel", route_rows_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, stream, a);
}

}  // namespace moesq::ops
