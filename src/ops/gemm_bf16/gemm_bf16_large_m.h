// Internal to ops/gemm_bf16: the large-M path for M ≥ kGemmLargeMinM and N ≥ kGemmLargeMinN
// (gemm_bf16_large_m.cu): 128×128 CTA tiles, a 3-stage cp.async pipeline, ldmatrix + mma.sync m16n8k16.
// Same arguments, same bits per row as the 64×64 tile kernel (the batch invariance of gemm_bf16.h;
// tests/gpu/test_engine_ops.cu GemmBf16LargeMBitsEqualRowAlone), for prefill GEMMs: measured on the
// H200 (bench/NOTES.md, session 17) at 1.6–1.95× the tile kernel from M = 2,048 up and 0.63–0.86× at
// M ≤ 512, so gemm_bf16 takes it from M = 1,024 (gemm_bf16_large_m_fits).
#pragma once
#include "ops/gemm_bf16/gemm_bf16.h"

namespace moesq::ops::detail {

constexpr int kGemmLargeTile = 128;  // CTA tile edge (M and N)
// Narrower GEMMs (the router's N = E) keep the 64×64 tile kernel, whose split-K slices spread over many
// more CTAs than ⌈N/128⌉ column tiles would.
constexpr int64_t kGemmLargeMinN = 512;
// Below this the 64×64 tile kernel is faster (more CTAs than 128×128 tiles give at small M).
constexpr int64_t kGemmLargeMinM = 1024;
// True when gemm_bf16 takes the large-M path for `args`: M ≥ kGemmLargeMinM and N ≥ kGemmLargeMinN
// (with or without split_ws: the slices are folded in registers, split_ws is not touched). The path
// itself runs any M > kGemmSmallM (the tests call it at M = 129…1,000).
bool gemm_bf16_large_m_fits(const GemmBf16Args& args);
void gemm_bf16_large_m(const GemmBf16Args& args, cudaStream_t stream);  // args already checked
// The 64×64 tile kernel at any M (what gemm_bf16 runs for 64 < M < kGemmLargeMinM or N < kGemmLargeMinN):
// for tests comparing the paths' bits and for bench_gemm_bf16's "before" column.
void gemm_bf16_tile(const GemmBf16Args& args, cudaStream_t stream);  // args already checked

}  // namespace moesq::ops::detail
