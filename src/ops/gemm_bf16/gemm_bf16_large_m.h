// Internal to ops/gemm_bf16: the large-M path for M > kGemmSmallM and N ≥ kGemmLargeMinN
// (gemm_bf16_large_m.cu): 128×128 CTA tiles, a 3-stage cp.async pipeline, ldmatrix + mma.sync m16n8k16.
// Same arguments, same bits per row as the 64×64 tile kernel (the batch invariance of gemm_bf16.h),
// for prefill and large-batch decode GEMMs at several times its rate. Status: written and compiled in
// session 16, when no device was lent; gemm_bf16 does not dispatch to it until tests/gpu/
// test_engine_ops.cu (GemmBf16LargeM*) and bench_gemm_bf16 have run on the H200 (bench/NOTES.md).
// Then gemm_bf16 takes it when gemm_bf16_large_m_fits.
#pragma once
#include "ops/gemm_bf16/gemm_bf16.h"

namespace moesq::ops::detail {

constexpr int kGemmLargeTile = 128;  // CTA tile edge (M and N)
// Narrower GEMMs (the router's N = E) keep the 64×64 tile kernel, whose split-K slices spread over many
// more CTAs than ⌈N/128⌉ column tiles would.
constexpr int64_t kGemmLargeMinN = 512;
// True when the large-M path takes `args`: M > kGemmSmallM and N ≥ kGemmLargeMinN (with or without
// split_ws: the slices are folded in registers, split_ws is not touched).
bool gemm_bf16_large_m_fits(const GemmBf16Args& args);
void gemm_bf16_large_m(const GemmBf16Args& args, cudaStream_t stream);  // args already checked
// The 64×64 tile kernel at any M (what gemm_bf16 ran for M > 64 before the large-M path, and still runs
// with split_ws): for tests comparing the paths' bits and for bench_gemm_bf16's "before" column.
void gemm_bf16_tile(const GemmBf16Args& args, cudaStream_t stream);  // args already checked

}  // namespace moesq::ops::detail
