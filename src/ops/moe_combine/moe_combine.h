// Launcher: weighted combine of routed expert outputs into the residual stream, in a FIXED order:
//   h[t] += Σ_j w[t, j] · y[e_j, slot(t, j)]   (j in ascending expert id, from zero, as the CPU
// forward's combine), no atomics. slot(t, j) comes from inverting the dispatch's route_of_slot, so
// the bits do not depend on the (atomic) order in which the dispatch filled an expert's slots.
// CPU twin: moe_combine_ref, bitwise equal (products and sums rounded as written, no fma).
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace moesq::ops {

struct MoeCombineArgs {
  const uint16_t* y = nullptr;          // [E, capacity, ldy] bf16 expert outputs (valid slots only)
  const int32_t* route_of_slot = nullptr;  // [E, capacity] route id t·k + j of each filled slot
  const int32_t* counts = nullptr;      // [E] routes per expert (clamped to capacity)
  const int32_t* topk_ids = nullptr;    // [T, k]
  const float* topk_w = nullptr;        // [T, k]
  int32_t* slot_of_route = nullptr;     // [T, k] scratch: slot of each route, −1 if dropped
  float* h = nullptr;                   // [T, H] fp32 residual, updated in place
  int64_t T = 0, H = 0, ldy = 0;
  int topk = 0, num_experts = 0, capacity = 0;  // k ≤ 32
};

void moe_combine(const MoeCombineArgs& args, cudaStream_t stream);
void moe_combine_ref(const MoeCombineArgs& args);  // host pointers
void moe_combine_check(const MoeCombineArgs& args);

}  // namespace moesq::ops
