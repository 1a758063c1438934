// Internal to ops/gemm_bf16: the decode path (gemm_bf16_decode.cu) for M ≤ kGemmSmallM tokens. A CTA
// of 8 (or 4) warps owns 128 output columns and ALL the (≤ 64) tokens: the tokens' K tile is staged
// once in shared memory for its warps, so W is read once per call and the activations once per 128
// columns (the small-M kernel reads them once per 16 columns: at M = 64 that is 8× W's bytes through
// L2, bench/NOTES.md session 31). Split slices (split_ws) are CTAs of one thread-block cluster, folded in
// slice order through distributed shared memory: no partials in global memory, no second kernel.
// Same bits per row as the 64×64 tile kernel (gemm_bf16.h's batch invariance; tests/gpu/
// test_engine_ops.cu compares them).
#pragma once
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/gemm_bf16/gemm_bf16_small_m.h"  // kGemmSmallM

namespace moesq::ops::detail {

// Most split slices a call may have (one cluster of that many CTAs; 8 is the portable cluster size).
constexpr int kGemmDecodeMaxSlices = 8;

// True when the decode path can run `args`: M ≤ kGemmSmallM, ≤ kGemmDecodeMaxSlices split slices, no
// fused_topk (the small-M kernel runs that).
bool gemm_bf16_decode_fits(const GemmBf16Args& args);
// Whether gemm_bf16 takes it: gemm_bf16_decode_fits, M ≥ gemm_bf16_decode_min_m(), and at least
// kGemmDecodeMinCtas CTAs of 128 columns (N tiles × slices × groups: the router's N = 128 makes 4 —
// a few SMs streaming — where the small-M kernel's 16-column CTAs spread it wider);
// MOESQ_DECODE_GEMM_MIN_CTAS overrides the count (1: every call that fits, as the tiny models' engine
// tests need to reach the path). Read once per process.
bool gemm_bf16_decode_enabled(const GemmBf16Args& args);
constexpr int64_t kGemmDecodeMinCtas = 16;
// The smallest M gemm_bf16 sends to the decode path: MOESQ_DECODE_GEMM_MIN_M (default
// kGemmDecodeMinM; 65 turns it off), read once per process.
int64_t gemm_bf16_decode_min_m();
constexpr int64_t kGemmDecodeMinM = 1;
// args already checked and gemm_bf16_decode_fits. warp_cols: output columns per warp, 16 (8 column
// warps a CTA) or 32 (4: each staged activation fragment feeds 4 n8 MMAs instead of 2, half the
// shared-memory reads per MMA where many tokens make them the cost); warp_rows: 1, or 2 (with 32
// columns only; M > 16): the column warps repeated twice, each row of warps taking half the token tiles
// (8 warps, each W fragment fed by half the activation fragments). The two-argument form takes the
// layout for M tokens: 8 warps × 16 columns for M ≤ 16, 2 rows × 4 warps × 32 columns above
// (bench/NOTES.md session 32, H200: q|k|v at M = 64 26.9 → 24.8 µs, the lm_head 367 → 327 µs; at M ≤ 8
// the 4-warp layouts lose 10–13 %); MOESQ_DECODE_GEMM_WARP_COLS (16 or 32) and MOESQ_DECODE_GEMM_WARP_ROWS
// (1 or 2, taken with 32 columns only) fix it for every M, read once per process. The bits depend on
// neither. Throws on other values.
// With MOESQ_DECODE_GEMM_WGMMA=1 (read once per process; default 0 until measured in the engine), M > 16
// takes gemm_bf16_decode_wg instead.
void gemm_bf16_decode(const GemmBf16Args& args, cudaStream_t stream);
void gemm_bf16_decode(const GemmBf16Args& args, cudaStream_t stream, int warp_cols, int warp_rows = 1);
// The wgmma form (gemm_bf16_decode_wg.cu; sm_90a): one warpgroup per CTA, 128 columns × all 64 token
// rows per wgmma m64n128k16, W K-major in 128-byte-swizzled shared memory, the tokens' fragments from
// registers — the same chain per element, so the same bits (bench/probe_wgmma_order, session 33). Any
// M ≤ 64 (rows past M multiply zeros: at M ≤ 16 three quarters of its MMA work is padding). args already
// checked and gemm_bf16_decode_fits.
void gemm_bf16_decode_wg(const GemmBf16Args& args, cudaStream_t stream);

}  // namespace moesq::ops::detail
