// Internal to ops/gemm_bf16: the large-M path (gemm_bf16_large_m.cu): 128×128 CTA tiles, a 3-stage
// cp.async pipeline, ldmatrix + mma.sync m16n8k16. Same arguments, same bits per row as the 64×64 tile
// kernel (the batch invariance of gemm_bf16.h; tests/gpu/test_engine_ops.cu GemmBf16LargeMBitsEqualRowAlone,
// and bench_gemm_bf16 checks every shape it times). Measured on the H200 (bench/NOTES.md, sessions 17 and
// 19): 1.6–1.95× the tile kernel at M ≥ 2,048, and at M = 128–512 1.06–1.67× where the 128×128 tiles
// fill the GPU (lm_head, q|k|v at 512) but 0.27–0.93× where they do not (o_proj at M ≤ 512: ≤ 64 tiles),
// so gemm_bf16 takes it by gemm_bf16_large_m_fits.
#pragma once
#include "ops/gemm_bf16/gemm_bf16.h"

namespace moesq::ops::detail {

constexpr int kGemmLargeTile = 128;  // CTA tile edge (M and N)
// Narrower GEMMs (the router's N = E) keep the 64×64 tile kernel, whose split-K slices spread over many
// more CTAs than ⌈N/128⌉ column tiles would.
constexpr int64_t kGemmLargeMinN = 512;
// From this M on the large-M path is faster whatever N (≥ kGemmLargeMinN) and G.
constexpr int64_t kGemmLargeMinM = 1024;
// Below kGemmLargeMinM, a GEMM without counts takes it when it has at least this many 128×128 tiles
// (about one wave on the H200's 132 SMs); grouped GEMMs with counts (ragged expert rows, which the
// 64-row tiles waste less on) keep the tile kernel there.
constexpr int64_t kGemmLargeMinTiles = 128;
// True when gemm_bf16 takes the large-M path for `args`: M > kGemmSmallM, N ≥ kGemmLargeMinN, and
// M ≥ kGemmLargeMinM or (no counts and ⌈M/128⌉·⌈N/128⌉·G ≥ kGemmLargeMinTiles); with or without split_ws
// (the slices are folded in registers, split_ws is not touched). The path itself runs any M > kGemmSmallM.
bool gemm_bf16_large_m_fits(const GemmBf16Args& args);
void gemm_bf16_large_m(const GemmBf16Args& args, cudaStream_t stream);  // args already checked
// The 64×64 tile kernel at any M (what gemm_bf16 runs for M > 64 where gemm_bf16_large_m_fits is false):
// for tests comparing the paths' bits and for bench_gemm_bf16's "before" column.
void gemm_bf16_tile(const GemmBf16Args& args, cudaStream_t stream);  // args already checked

}  // namespace moesq::ops::detail
