// Internal: the routes kernel of the grouped sparse GEMM (sparse_gemm_routes.cu), called by
// ops::sparse_gemm for decode-sized calls that carry their routes (SparseGemmArgs::route_experts).
// Same arguments and bits as the mma.sp kernel; activations in format::ActLayout::kMmaFragment.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/sparse_gemm/sparse_gemm.h"

namespace moesq::ops::detail {

// Whether the routes kernel runs this call: route_experts given, 0 < capacity ≤ routes_max_tokens
// (≤ kRoutesMaxChunkedTokens), E ≤ 1024, activations in kMmaFragment, the staged rows fit in shared memory.
bool sparse_gemm_routes_fits(const SparseGemmArgs& args);

// Launches it (arguments validated by the caller, sparse_gemm).
void launch_sparse_gemm_routes(const SparseGemmArgs& args, cudaStream_t stream);

}  // namespace moesq::ops::detail
