// Internal to ops/gemm_bf16: the small-M path gemm_bf16 takes when M ≤ kGemmSmallM (gemm_bf16_small_m.cu).
// Same arguments, same bits per row as the 64×64 tile kernel (the batch invariance of gemm_bf16.h);
// with split_ws the slices are added inside the kernel and split_ws is not touched.
#pragma once
#include "ops/gemm_bf16/gemm_bf16.h"

namespace moesq::ops::detail {

// K chains per output element of the decode kernels (small-M, W-as-A): ⌈K / kGemmSplitK⌉ slices with
// split_ws, else 1 (the whole K).
__host__ __device__ inline int gemm_bf16_chain_slices(const GemmBf16Args& a) {
  return a.split_ws ? static_cast<int>((a.K + kGemmSplitK - 1) / kGemmSplitK) : 1;
}

// Largest M the small-M path takes: up to 4 row tiles of 16, each re-reading W (from L2).
constexpr int64_t kGemmSmallM = 64;
// True when the small-M path takes `args`: M ≤ kGemmSmallM and its shared memory (4 K tiles per warp, one
// 16×16 fp32 tile per chain) fits the SM.
bool gemm_bf16_small_m_fits(const GemmBf16Args& args);
// args already checked. token_tiles: the 16-token tiles each warp multiplies against one staged W tile —
// 1 (a CTA row per 16 tokens, each re-reading W from L2), 2 or 4 (W read once per 32 or 64 tokens; taken
// where M needs them, the shared memory fits a ring of ≥ 2 stages and there is no fused routing; else 1).
// The two-argument form takes MOESQ_SMALL_M_TOKEN_TILES (default 1, read once per process). The bits do
// not depend on it.
void gemm_bf16_small_m(const GemmBf16Args& args, cudaStream_t stream);
void gemm_bf16_small_m(const GemmBf16Args& args, cudaStream_t stream, int token_tiles);
int gemm_bf16_small_m_token_tiles();

// The decode GEMM kernels' L2 prefetch before the PDL wait (small-M and W-as-A paths): the first
// gemm_bf16_prefetch_bytes(args) bytes of W, shared by the first kGemmPrefetchCtas CTAs
// (prefetch_l2_grid). MOESQ_L2_PREFETCH_MB (default 24, half of an H100/H200's 50 MB L2; 0: none; −1:
// the small-M kernel's per-CTA rows, session 28's rule, returned as −1), never past W. Grouped calls
// with counts, K % 8 ≠ 0 or an unaligned W: 0.
constexpr int kGemmPrefetchCtas = 128;
int64_t gemm_bf16_prefetch_bytes(const GemmBf16Args& args);

}  // namespace moesq::ops::detail
