// Launcher: batch-invariant grouped bf16 GEMM, y_g = x_g · W_gᵀ (PyTorch Linear layout), fp32
// accumulation on the tensor cores. Used for the attention projections, the router, the lm_head and
// the dense (bf16) expert backend. CPU twin: gemm_bf16_ref (same descriptor, host pointers).
//
// Non-obvious decision: ONE reduction order (64-wide K tiles, split-K only by the K-fixed slices of
// split_ws) for every shape, so an output row's value — one chain of k16 tensor-core MMAs in
// ascending K (hi then lo) per slice, slices added in order — depends on K alone, never on M, N or
// the other rows of the batch: a token's bits are independent of batch composition (deterministic
// mode, DESIGN.md §6). cuBLAS chooses kernels by shape and cannot promise it. Every kernel runs that
// order: the 64×64 tile kernel, the 128×128 large-M kernel, and for M ≤ 64 (decode) the decode path (a
// CTA of 128 columns and every token, gemm_bf16_decode.cu) or the small-M kernel (a chain per warp,
// gemm_bf16_small_m.cu), both adding the slices themselves; tests compare their bits.
// With x_lo the activations are split hi + lo (two bf16 MMAs per tile, hi first): fp32-grade inputs
// on bf16 tensor cores, for the GEMMs whose input rounding would otherwise dominate the error.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ops/router_topk/router_topk.h"

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace moesq::ops {

struct GemmBf16Args {
  const uint16_t* x = nullptr;    // [G, M, K] bf16 rows (row stride K)
  const uint16_t* x_lo = nullptr; // [G, M, K] bf16 low parts (x ≈ x + x_lo, ~16 significant bits), or nullptr
  const uint16_t* w = nullptr;    // [G, N, K] bf16 weights
  float* y_f32 = nullptr;         // [G, M, ldy] fp32 output, or nullptr
  uint16_t* y_bf16 = nullptr;     // [G, M, ldy] bf16 output, or nullptr (exactly one of the two)
  bool accumulate = false;        // y_f32 += x·Wᵀ (residual add) instead of y_f32 = x·Wᵀ
  const int32_t* counts = nullptr;  // [G] valid rows per group (clamped to M), nullptr: all M
  int groups = 1;
  int64_t M = 0, N = 0, K = 0;    // K % 8 == 0
  int64_t ldy = 0;                // ≥ N
  // Fixed split-K (groups == 1, y_f32 only): K is cut into ⌈K / kGemmSplitK⌉ slices — a function of K
  // alone — each slice's product goes to split_ws [slices, M, N] fp32 and a second kernel adds the
  // slices in ascending order (then the old y when accumulate). Same bits for a row at any M, so the
  // split stays batch-invariant; it multiplies the CTAs of a small-M, small-N GEMM by the slice count.
  // Callers must use it for EVERY call of a given GEMM (prefill and decode) to keep one reduction order.
  float* split_ws = nullptr;      // ≥ gemm_bf16_split_floats(M, N, K) floats, or nullptr (no split)
  // Host pointer, or nullptr: the routing of these logits run by the GEMM kernel itself — its last
  // CTA to finish (a ticket in global memory) runs ops::router_topk's per-token code on y_f32, so the
  // decode step's router needs no kernel of its own (measured slower than the two kernels under PDL, so
  // the engine leaves it off unless MOESQ_FUSED_TOPK=1; bench/NOTES.md, session 29). Same ids, weights
  // and counts zeroing bits as gemm_bf16 then router_topk. Only where gemm_bf16_fuses_topk(args):
  // the small-M path, groups 1, no counts, y_f32 = fused_topk->logits with ldy = N = num_experts,
  // M = T, no accumulate.
  const RouterTopkArgs* fused_topk = nullptr;
  // [1] int32 in device memory, 0 before the call; the kernel leaves it 0. One call at a time per
  // ticket (a layer's). Required with fused_topk.
  int32_t* topk_ticket = nullptr;
};

constexpr int kGemmBlockM = 64, kGemmBlockN = 64, kGemmBlockK = 64;
constexpr int64_t kGemmSplitK = 512;  // K per split slice (a multiple of kGemmBlockK)
size_t gemm_bf16_split_floats(int64_t M, int64_t N, int64_t K);

// Whether gemm_bf16 can run args.fused_topk (the small-M path with the layout above); false when
// fused_topk is nullptr.
bool gemm_bf16_fuses_topk(const GemmBf16Args& args);

// Errors: K not a multiple of 8, ldy < N, not exactly one output, bad sizes, fused_topk where
// gemm_bf16_fuses_topk is false or without a ticket.
void gemm_bf16(const GemmBf16Args& args, cudaStream_t stream);
// Plain loops over host pointers; fp32 products of the bf16 inputs summed in fp64, rounded once;
// then router_topk_ref(*fused_topk) when given.
void gemm_bf16_ref(const GemmBf16Args& args);
void gemm_bf16_check(const GemmBf16Args& args);  // the launcher's argument checks (shared by the ref)

}  // namespace moesq::ops
