// Launcher: SwiGLU + requantization between the two expert GEMMs. The gate|up GEMM output
// h [E, capacity, 2I] (gate = columns [0, I), up = [I, 2I)) becomes the down GEMM's input batch
// a = NVFP4(silu(gate)·up) (or bf16 for W4A16) in the K order of the down GEMM kernel (format::ActLayout).
// CPU twin: swiglu_quant_ref (swiglu_quant_ref.cpp), same descriptor on host pointers.
#pragma once
#include <cstdint>
#include <vector>

#include "core/cuda/stream.h"
#include "format/kernel_layout.h"
#include "ops/common/act_batch.h"

namespace moesq::ops {

struct SwigluQuantArgs {
  const uint16_t* h = nullptr;       // [E, capacity, 2I] bf16 gate|up, or nullptr when h_f32 is given
  // [E, capacity, 2I] fp32 gate|up (the GEMM's fp32 output), or nullptr. With quantize, silu(g)·u
  // stays fp32 into the quantizer, as in the CPU W4A4 forward (no bf16 rounding before the codes).
  const float* h_f32 = nullptr;
  const int32_t* counts = nullptr;   // [E] device token counts (clamped to capacity here)
  int num_experts = 0, capacity = 0;
  int64_t I = 0, I_pad = 0;          // I % 32 == 0; I_pad = format::padded_k(I)
  bool quantize = true;
  // [E] static γ_a per expert (the checkpoint's input_global_scale of down_proj: compressed-tensors
  // input_activations.dynamic false), each finite and > 0, or nullptr: γ_a per row = 448·6/amax (Eq. 5).
  const float* act_gamma = nullptr;
  format::ActLayout layout = format::ActLayout::kMmaFragment;  // K order of out: the GEMM kernel that reads it
  uint16_t* out = nullptr;           // [E, capacity, I_pad] bf16, format::act_storage_index(·, layout) order
  float* inv_scale = nullptr;        // [E, capacity] 1/γ_a
  // Route-indexed grid (what moe_block uses): one CTA per route r < routes, on the slot
  // (topk_ids[r], slot_of_route[r]) (act_dispatch's output; −1: dropped, skipped) instead of one CTA
  // per (expert, slot) of the E × capacity grid. Same values in the same slots; nullptr: that grid.
  const int32_t* topk_ids = nullptr;       // [routes]
  const int32_t* slot_of_route = nullptr;  // [routes]
  int64_t routes = 0;
  // Route grid: only the routes of experts [expert_begin, expert_end) (an expert-parallel rank's shard,
  // whose other experts' gate|up rows it never computed); expert_end < 0: every expert.
  int64_t expert_begin = 0, expert_end = -1;
  // gpt-oss's experts (model/decoder.cpp expert_activation): per-expert biases added to gate and up
  // first, and the clamped SwiGLU h = (clamp(u, ±limit) + 1) · (min(g, limit) · σ(alpha · min(g, limit)))
  // (core/swiglu.h clamped_swiglu) instead of silu(g)·u.
  const float* gate_up_bias = nullptr;  // [E, 2I] fp32: expert e's gate bias [I], then its up bias [I]; or nullptr
  bool clamped = false;
  float alpha = 1.702f, limit = 7.0f;
};

// Errors: I not a multiple of 32, I_pad not a multiple of 256 or < I, bad sizes, unknown layout.
void swiglu_quant(const SwigluQuantArgs& args, cudaStream_t stream);
void swiglu_quant_check(const SwigluQuantArgs& args);  // the launcher's argument checks (shared by the ref)

// The CPU twin on HOST pointers: for every filled slot (slot < min(counts[e], capacity); with the route
// grid, the slots the valid routes name) a = silu(gate)·up in fp32 (biases and clamped SwiGLU when given) (silu(g) = g / (1 + exp(−g))), then
// rounded to bf16 and act_quant_row_ref — or, from h_f32 with quantize, kept fp32 into
// act_quant_row_f32_ref — into out (zero past I up to I_pad) and inv_scale. Other slots untouched.
// Errors: the launcher's.
void swiglu_quant_ref(const SwigluQuantArgs& args);

// swiglu_quant_ref into a fresh ActBatch (K = I, K_pad = padded_k(I), counts copied from `counts`):
// h [E, capacity, 2I] bf16 bits (gate = columns [0, I), up = [I, 2I)). Errors: h not [E, capacity, 2I],
// the launcher's checks.
ActBatch swiglu_quant_batch_ref(const std::vector<uint16_t>& h, int num_experts, int capacity, int64_t I,
                                const std::vector<int32_t>& counts, bool quantize,
                                format::ActLayout layout = format::ActLayout::kMmaFragment);

}  // namespace moesq::ops
