// The host-side activation batch of the MoE expert ops (the B operand of the grouped sparse GEMM, in
// kernel K order) and its row quantizer, shared by the `_ref` twins of act_dispatch, swiglu_quant and
// sparse_gemm (device twin of act_quant_row_ref: ops/common/nvfp4_row.cuh).
//
// Non-obvious decision: activations are quantized with a PER-TOKEN tensor scale γ_a (Eq. 5 on the
// token row), so a token's result never depends on which other tokens share its batch; the decoded
// values dec(q)·dec(c) are exact in bf16 and 1/γ_a joins 1/γ_w in the epilogue factor
// α = (1/γ_w)·(1/γ_a), in that fp32 order, on both CPU and GPU.
#pragma once
#include <cstdint>
#include <vector>

#include "format/kernel_layout.h"

namespace moesq::ops {

// Per-expert batched activations in kernel layout (the B operand of the grouped GEMM).
struct ActBatch {
  int num_experts = 0;
  int capacity = 0;                // slots per expert
  int64_t K = 0, K_pad = 0;        // logical and padded contraction dim (format::padded_k(K))
  format::ActLayout layout = format::ActLayout::kMmaFragment;  // K order of x (format::act_storage_index(k, layout))
  std::vector<uint16_t> x;         // [E, capacity, K_pad] bf16 bits, format::act_storage_index(·, layout) order; 0 past K
  std::vector<float> inv_scale;    // [E, capacity] 1/γ_a of the slot's token (1 for bf16 / W4A16)
  std::vector<int32_t> counts;     // [E] tokens routed to the expert (may exceed capacity: dropped)
  std::vector<int32_t> route_of_slot;  // [E, capacity] route id r = token·topk + j, −1 when empty
};

// One token row x [K] (bf16 bits, logical order) → out [K_pad] bf16 bits in act_storage_index(·, layout)
// order. quantize: NVFP4 with 32-element UE4M3 blocks and γ_a = nvfp4_tensor_scale(amax(x)) (Eq. 5), the
// same fp32 order as format::quantize_activation_row, storing dec(q)·dec(c) (exact) and *inv_scale = 1/γ_a.
// static_gamma > 0 replaces that γ_a (a checkpoint's static input_global_scale, compressed-tensors
// input_activations.dynamic false: format::nvfp4_fake_quant_blocks with the given global scale).
// !quantize (W4A16): the bf16 values, permuted; *inv_scale = 1. The layout changes only where values
// go, never their bits. Errors: K not a positive multiple of 32.
void act_quant_row_ref(const uint16_t* x, int64_t K, bool quantize, uint16_t* out, float* inv_scale,
                       format::ActLayout layout = format::ActLayout::kMmaFragment, float static_gamma = 0.0f);

// The same NVFP4 quantizer on an fp32 row (the fp32-input paths of act_dispatch / swiglu_quant).
void act_quant_row_f32_ref(const float* x, int64_t K, uint16_t* out, float* inv_scale,
                           format::ActLayout layout = format::ActLayout::kMmaFragment, float static_gamma = 0.0f);

// An all-empty batch of E experts × capacity slots for rows of K values in `layout`: x zero, 1/γ_a = 1,
// counts 0, no routes.
ActBatch empty_act_batch(int num_experts, int capacity, int64_t K, format::ActLayout layout);

}  // namespace moesq::ops
