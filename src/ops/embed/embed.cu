// Embedding gather and bf16 row gather kernels (embed.h): one CTA of 256 threads per output row.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/embed/embed.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

// h[t] = fp32(embed[ids[t]]).
__global__ void embed_kernel(const int32_t* ids, const uint16_t* embed, float* h, int64_t H) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  const int64_t t = blockIdx.x;
  const uint16_t* row = embed + static_cast<int64_t>(ids[t]) * H;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) h[t * H + c] = __bfloat162float(__ushort_as_bfloat16(row[c]));
}

// out[i] = in[rows[i]] (bf16 rows of width H).
__global__ void gather_rows_kernel(const uint16_t* in, const int32_t* rows, uint16_t* out, int64_t H) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  const int64_t i = blockIdx.x;
  const uint16_t* src = in + static_cast<int64_t>(rows[i]) * H;
  for (int64_t c = threadIdx.x; c < H; c += blockDim.x) out[i * H + c] = src[c];
}

}  // namespace

void embed(const EmbedArgs& a, cudaStream_t stream) {
  launch_pdl("embed_kernel", embed_kernel, dim3(static_cast<unsigned>(a.T)), dim3(kThreads), 0, stream, a.ids,
             a.table, a.out, a.H);
}

void gather_rows(const GatherRowsArgs& a, cudaStream_t stream) {
  launch_pdl("gather_rows_kernel", gather_rows_kernel, dim3(static_cast<unsigned>(a.n)), dim3(kThreads), 0, stream,
             a.in, a.rows, a.out, a.H);
}

}  // namespace moesq::ops
