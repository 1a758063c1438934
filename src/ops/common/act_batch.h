// CPU `_ref` twins of the Hopper MoE expert kernels in src/cuda (one per kernel, same data layout):
//   act_quant_row_ref     ↔ cuda/act_dispatch.cu   (bf16 row → NVFP4 → exact bf16, kernel K order)
//   dispatch_ref          ↔ cuda/act_dispatch.cu   (routes → per-expert batches, fixed capacity)
//   grouped_sparse_gemm_ref ↔ cuda/sparse_gemm.cu  (Y_eᵀ = α · W_e X_eᵀ on the packed bits)
//   swiglu_quant_ref      ↔ cuda/swiglu_quant.cu   (gate|up → silu(gate)·up → next GEMM's input)
// They define the arithmetic the kernels must reproduce; only fp32 summation order may differ.
//
// Non-obvious decision: activations are quantized with a PER-TOKEN tensor scale γ_a (Eq. 5 on the
// token row), so a token's result never depends on which other tokens share its batch; the decoded
// values dec(q)·dec(c) are exact in bf16 and 1/γ_a joins 1/γ_w in the epilogue factor
// α = (1/γ_w)·(1/γ_a), in that fp32 order, on both CPU and GPU.
#pragma once
#include <cstdint>
#include <vector>

#include "format/nvfp4.h"
#include "format/kernel_layout.h"

namespace moesq::moe {

// Per-expert batched activations in kernel layout (the B operand of the grouped GEMM).
struct ActBatch {
  int num_experts = 0;
  int capacity = 0;                // slots per expert
  int64_t K = 0, K_pad = 0;        // logical and padded contraction dim (padded_k(K))
  ActLayout layout = ActLayout::kMmaFragment;  // K order of x (act_storage_index(k, layout))
  std::vector<uint16_t> x;         // [E, capacity, K_pad] bf16 bits, act_storage_index(·, layout) order; 0 past K
  std::vector<float> inv_scale;    // [E, capacity] 1/γ_a of the slot's token (1 for bf16 / W4A16)
  std::vector<int32_t> counts;     // [E] tokens routed to the expert (may exceed capacity: dropped)
  std::vector<int32_t> route_of_slot;  // [E, capacity] route id r = token·topk + j, −1 when empty
};

// One token row x [K] (bf16 bits, logical order) → out [K_pad] bf16 bits in act_storage_index(·, layout)
// order. quantize: NVFP4 with 32-element UE4M3 blocks and γ_a = nvfp4_tensor_scale(amax(x)) (Eq. 5), the
// same fp32 order as format::quantize_activation_row, storing dec(q)·dec(c) (exact) and *inv_scale = 1/γ_a.
// !quantize (W4A16): the bf16 values, permuted; *inv_scale = 1. The layout changes only where values
// go, never their bits. Errors: K not a positive multiple of 32.
void act_quant_row_ref(const uint16_t* x, int64_t K, bool quantize, uint16_t* out, float* inv_scale,
                       ActLayout layout = ActLayout::kMmaFragment);

// Routes → batches. x: [T, K] bf16 bits; topk_ids: [T, topk] expert ids in [0, E). Slots are filled
// in ascending route id (the canonical order); routes past `capacity` are counted but dropped. The
// batch's rows are in `layout` K order (ActBatch::layout). Errors: bad sizes, an id out of range.
ActBatch dispatch_ref(const uint16_t* x, int64_t T, int64_t K, const int32_t* topk_ids, int topk, int num_experts,
                      int capacity, bool quantize, ActLayout layout = ActLayout::kMmaFragment);

// Decoded weights of a paired 4:8 tensor WITHOUT the tensor scale: dec(q)·dec(scale) at the kept
// positions, 0 elsewhere. out: [N, K] fp32 (exact).
void sparse48_decode_unscaled(const format::Sparse48Tensor& t, float* out);

// Y[e, slot, m] = (1/γ_w[e]) · (1/γ_a[e, slot]) · Σ_k Wdec_e[m, k] · Xdec[e, slot, k] for slots <
// min(count_e, capacity), accumulated in fp64 then rounded once to fp32; other slots untouched.
// x is read through act.layout, so both layouts of the same tokens give bitwise the same y.
// experts[e] must be [M, K] with the batch's K. y: [E, capacity, M] fp32.
void grouped_sparse_gemm_ref(const std::vector<const format::Sparse48Tensor*>& experts, const ActBatch& act,
                             float* y);

// SwiGLU between the GEMMs: h [E, capacity, 2I] (gate = columns [0, I), up = [I, 2I)) →
// a = silu(gate)·up in fp32 (silu(g) = g / (1 + exp(−g))), rounded to bf16, then act_quant_row_ref
// (NVFP4 when quantize, rows in `layout` K order) into out (an ActBatch with K = I, counts copied from
// `counts`). Errors: h not [E, capacity, 2I].
ActBatch swiglu_quant_ref(const std::vector<uint16_t>& h, int num_experts, int capacity, int64_t I,
                          const std::vector<int32_t>& counts, bool quantize,
                          ActLayout layout = ActLayout::kMmaFragment);

}  // namespace moesq::moe
