// Combine kernel (moe_combine.h): one CTA per token. The k routes' (row pointer, weight) go to shared
// memory in ascending expert id (rank of each route among the token's ids, ties by route index, as
// the twin's stable sort); then every thread sums its columns over them in that order, loading all
// the routes' values of a column chunk before the first add.
#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/moe_combine/moe_combine.h"
#include "ops/rmsnorm/rmsnorm_row.cuh"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;
static_assert(kThreads == detail::kRmsNormThreads, "the fused norm's tree is one thread per lane of the CTA");
constexpr int kMaxTopk = 32;
constexpr int kBatch = 8;  // routes whose loads are in flight together

// V columns per thread: 8 (16-byte loads; H and ldy multiples of 8) or 1.
// fuse_norm: then rmsnorm's row code on h[t] (MoeCombineArgs::fused_norm).
template <int V>
__global__ void __launch_bounds__(kThreads) combine_kernel(MoeCombineArgs a, RmsNormArgs norm, bool fuse_norm) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  __shared__ int s_id[kMaxTopk];
  __shared__ const uint16_t* s_row[kMaxTopk];  // y row of the q-th route in expert order, nullptr: dropped
  __shared__ float s_w[kMaxTopk];
  __shared__ const float* s_bias[kMaxTopk];  // the route's expert's down bias row, or nullptr
  const int64_t t = blockIdx.x;
  const int k = a.topk;
  if (threadIdx.x < k) s_id[threadIdx.x] = a.topk_ids[t * k + threadIdx.x];
  __syncthreads();
  if (threadIdx.x < k) {
    const int j = threadIdx.x, id = s_id[j];
    int rank = 0;
    for (int i = 0; i < k; ++i) rank += s_id[i] < id || (s_id[i] == id && i < j);
    const int s = a.slot_of_route[t * k + j];
    const bool ok = s >= 0 && s < a.capacity && id >= 0 && id < a.num_experts;
    s_row[rank] = ok ? a.y + (static_cast<int64_t>(id) * a.capacity + s) * a.ldy : nullptr;
    s_w[rank] = a.topk_w[t * k + j];
    s_bias[rank] = ok && a.down_bias ? a.down_bias + static_cast<int64_t>(id) * a.H : nullptr;
  }
  __syncthreads();
  float* h = a.h + t * a.H;
  for (int64_t c0 = static_cast<int64_t>(threadIdx.x) * V; c0 < a.H; c0 += static_cast<int64_t>(kThreads) * V) {
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.0f;
    for (int q0 = 0; q0 < k; q0 += kBatch) {
      uint16_t o[kBatch][V];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const uint16_t* row = q0 + b < k ? s_row[q0 + b] : nullptr;
        if constexpr (V == 8) {
          const uint4 p = row ? *reinterpret_cast<const uint4*>(row + c0) : make_uint4(0, 0, 0, 0);
          const uint32_t w[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
          for (int i = 0; i < 8; ++i) o[b][i] = static_cast<uint16_t>(w[i / 2] >> (16 * (i % 2)));
        } else {
          o[b][0] = row ? row[c0] : 0;
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (q0 + b >= k || !s_row[q0 + b]) continue;
        const float wq = s_w[q0 + b];
        const float* bias = s_bias[q0 + b];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          float y = __bfloat162float(__ushort_as_bfloat16(o[b][i]));
          if (bias) y = __fadd_rn(y, bias[c0 + i]);
          acc[i] = __fadd_rn(acc[i], __fmul_rn(y, wq));
        }
      }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) h[c0 + i] = __fadd_rn(h[c0 + i], acc[i]);
  }
  if (!fuse_norm) return;
  __shared__ double s_part[detail::kRmsNormThreads];
  __syncthreads();  // the row's h is complete and visible to the CTA
  detail::rmsnorm_row(norm, t, s_part);
}

}  // namespace

void moe_combine(const MoeCombineArgs& a, cudaStream_t stream) {
  moe_combine_check(a);
  if (a.T == 0) return;
  MOESQ_CHECK(a.T <= 0x7fffffff, "moe_combine: T=", a.T, " too large for the grid");
  const bool vec = a.H % 8 == 0 && a.ldy % 8 == 0 && reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
  const RmsNormArgs norm = a.fused_norm ? *a.fused_norm : RmsNormArgs{};
  const bool fuse = a.fused_norm != nullptr;
  if (vec)
    launch_pdl("combine_kernel", combine_kernel<8>, dim3(static_cast<unsigned>(a.T)), dim3(kThreads), 0, stream, a,
               norm, fuse);
  else
    launch_pdl("combine_kernel", combine_kernel<1>, dim3(static_cast<unsigned>(a.T)), dim3(kThreads), 0, stream, a,
               norm, fuse);
}

}  // namespace moesq::ops
