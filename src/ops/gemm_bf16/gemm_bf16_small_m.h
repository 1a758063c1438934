// Internal to ops/gemm_bf16: the small-M path gemm_bf16 takes when M ≤ kGemmSmallM (gemm_bf16_small_m.cu).
// Same arguments, same bits per row as the 64×64 tile kernel (the batch invariance of gemm_bf16.h);
// with split_ws the slices are added inside the kernel and split_ws is not touched.
#pragma once
#include "ops/gemm_bf16/gemm_bf16.h"

namespace moesq::ops::detail {

// Largest M the small-M path takes: up to 4 row tiles of 16, each re-reading W (from L2).
constexpr int64_t kGemmSmallM = 64;
// True when the small-M path takes `args`: M ≤ kGemmSmallM and its shared memory (4 K tiles per warp, one
// 16×16 fp32 tile per chain) fits the SM.
bool gemm_bf16_small_m_fits(const GemmBf16Args& args);
void gemm_bf16_small_m(const GemmBf16Args& args, cudaStream_t stream);  // args already checked

}  // namespace moesq::ops::detail
