// Launcher: weighted combine of routed expert outputs into the residual stream, in a FIXED order:
//   h[t] += Σ_j w[t, j] · y[e_j, slot(t, j)]   (j in ascending expert id, from zero, as the CPU
// forward's combine), no atomics. slot(t, j) is act_dispatch's slot_of_route (the inverse of its
// route_of_slot), so the bits do not depend on the (atomic) order in which the dispatch filled an
// expert's slots. One CTA per token row; each thread owns 8 adjacent columns (16-byte loads) when
// H and ldy are multiples of 8, else one.
// CPU twin: moe_combine_ref, bitwise equal (products and sums rounded as written, no fma).
#pragma once
#include <cstdint>

#include "ops/rmsnorm/rmsnorm.h"

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace moesq::ops {

struct MoeCombineArgs {
  const uint16_t* y = nullptr;              // [E, capacity, ldy] bf16 expert outputs (valid slots only)
  const int32_t* topk_ids = nullptr;        // [T, k]
  const float* topk_w = nullptr;            // [T, k]
  const int32_t* slot_of_route = nullptr;   // [T, k] slot of each route in its expert, < 0: dropped
  float* h = nullptr;                       // [T, H] fp32 residual, updated in place
  int64_t T = 0, H = 0, ldy = 0;
  int topk = 0, num_experts = 0, capacity = 0;  // k ≤ 32
  // gpt-oss's down_proj biases: [E, H] fp32, each route's term becomes w · (y + bias[e_j]) (the CPU
  // forward adds the bias to the expert's output before weighting it); nullptr: none.
  const float* down_bias = nullptr;
  // Host pointer, or nullptr: then each CTA normalizes the row it has just updated — rmsnorm's row code
  // (rmsnorm_row.cuh, its bits) on h[t] into fused_norm's outputs — so the next layer's input norm
  // needs no kernel of its own (bench/NOTES.md, session 29). fused_norm->x must be h, n = T, D = H.
  const RmsNormArgs* fused_norm = nullptr;
};

// Errors: bad sizes (k outside [1, 32], ldy < H, …), a fused_norm not over h's [T, H] rows.
void moe_combine(const MoeCombineArgs& args, cudaStream_t stream);
void moe_combine_ref(const MoeCombineArgs& args);  // host pointers; then rmsnorm_ref(*fused_norm) when given
void moe_combine_check(const MoeCombineArgs& args);

// slot_of_route [T·k] from a dispatch's route_of_slot [E, capacity] and counts [E] (host): −1 for routes
// in no slot. For tests and the CPU twins of the dispatch.
void invert_route_of_slot(const int32_t* route_of_slot, const int32_t* counts, int num_experts, int capacity,
                          int64_t routes, int32_t* slot_of_route);

}  // namespace moesq::ops
