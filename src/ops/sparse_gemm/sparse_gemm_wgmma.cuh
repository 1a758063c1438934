// Internal: the wgmma.mma_async.sp variant of the grouped sparse GEMM (sparse_gemm_wgmma.cu), called by
// ops::sparse_gemm when the config says GemmVariant::kWgmmaSp. Same arguments and arithmetic as the
// mma.sp kernel (sparse_gemm.h); activations must be in format::ActLayout::kKMajor.
#pragma once
#include <cuda_runtime_api.h>

#include "ops/sparse_gemm/sparse_gemm.h"

namespace moesq::ops::detail {

// Tile instances built: m64 tiles per warpgroup (BLOCK_M = 128·m64_tiles_per_warpgroup) × BLOCK_N
// (= 8·n_tiles) × stages.
bool wgmma_instance_exists(int m64_tiles_per_warpgroup, int block_n, int stages);

// Launches the persistent wgmma.sp kernel (one 384-thread CTA per SM). `num_sms`:
// the device's multiprocessor count. Arguments are validated by the caller (sparse_gemm).
void launch_sparse_gemm_wgmma(const SparseGemmArgs& args, const GemmConfig& config, int max_tokens, int num_sms,
                              cudaStream_t stream);

}  // namespace moesq::ops::detail
