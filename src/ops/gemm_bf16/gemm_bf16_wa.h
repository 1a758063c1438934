// Internal to ops/gemm_bf16: the W-as-A decode path (gemm_bf16_wa.cu), opt-in (MOESQ_SMALL_M_WA=1)
// until a device run shows its bits and its speed (bench/NOTES.md, session 29). For M ≤ 8 tokens it
// runs mma.sync m16n8k16 with 16 weight rows as the A operand and the tokens as the n8 columns of B:
// W streams from global memory straight into registers (3–6 64-wide K tiles in flight per warp, the
// first ones issued before the PDL wait, one warp per (16-row tile, K slice) chain up to 8 warps a CTA),
// the tokens' rows sit in shared memory once per CTA. Every
// output element gets the same chain as the 64×64 tile kernel — k16 steps in ascending K over 64-wide
// tiles from the range start (zero past it), hi then lo per step, from zero; split slices added in
// ascending order — so its bits equal the tile kernel's IF an element of mma.m16n8k16 does not depend
// on which operand supplies its row and which its column (bench/probe_mma_order.cu measures that;
// tests/gpu/test_engine_ops.cu GemmBf16WaBitsEqualTileKernel checks the path itself).
#pragma once
#include "ops/gemm_bf16/gemm_bf16.h"

namespace moesq::ops::detail {

constexpr int64_t kGemmWaMaxM = 8;  // the n8 tile of tokens

// True when the W-as-A path can run `args`: M ≤ kGemmWaMaxM, groups 1, no counts, no fused_topk, K % 8
// = 0, the tokens' rows fit in shared memory.
bool gemm_bf16_wa_fits(const GemmBf16Args& args);
// Whether gemm_bf16 takes it: MOESQ_SMALL_M_WA=1 and gemm_bf16_wa_fits (read once per process).
bool gemm_bf16_wa_enabled(const GemmBf16Args& args);
// args already checked. depth: 64-wide K tiles of W in registers per warp, 3, 4 or 6 (others: 3); the
// two-argument form takes MOESQ_WA_DEPTH (default 3, read once per process: gemm_bf16_wa_depth). The
// bits do not depend on the depth.
void gemm_bf16_wa(const GemmBf16Args& args, cudaStream_t stream);
void gemm_bf16_wa(const GemmBf16Args& args, cudaStream_t stream, int depth);
int gemm_bf16_wa_depth();

}  // namespace moesq::ops::detail
