// Launcher: dispatch routed token rows into per-expert batches for the grouped sparse GEMM, with
// NVFP4 activation quantization (W4A4) or a plain permuting copy (W4A16). CPU twin: act_dispatch_ref
// (act_dispatch_ref.cpp), same descriptor on host pointers. Layout: format/kernel_layout.h,
// docs/KERNEL_LAYOUT.md.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"
#include "format/kernel_layout.h"
#include "ops/common/act_batch.h"

namespace moesq::ops {

struct DispatchArgs {
  const uint16_t* x = nullptr;         // [T, K] bf16 token rows, logical K order
  // [T, K] bf16 residues (x + x_lo ≈ the fp32 row, ~16 significant bits), or nullptr. With quantize,
  // the row x + x_lo is quantized in fp32 (the CPU W4A4 forward quantizes fp32 rows: bf16 input
  // rounding flips E2M1/UE4M3 codes, measured in bench/NOTES.md e2e v4).
  const uint16_t* x_lo = nullptr;
  const int32_t* topk_ids = nullptr;   // [T, topk] expert ids in [0, E)
  int64_t T = 0;
  int topk = 0;
  int64_t K = 0, K_pad = 0;            // K % 32 == 0; K_pad = format::padded_k(K)
  int num_experts = 0, capacity = 0;
  bool quantize = true;                // false: W4A16, bf16 values only permuted
  // [E] static γ_a per expert (the checkpoint's input_global_scale of gate|up: compressed-tensors
  // input_activations.dynamic false), each finite and > 0 (the host loader checks), or nullptr: γ_a per
  // token row = 448·6/amax(row) (paper Eq. 5). Read only with quantize.
  const float* act_gamma = nullptr;
  format::ActLayout layout = format::ActLayout::kMmaFragment;  // K order of out: the GEMM kernel that reads it
  uint16_t* out = nullptr;             // [E, capacity, K_pad] bf16, format::act_storage_index(·, layout) order
  float* inv_scale = nullptr;          // [E, capacity] 1/γ_a per slot
  int32_t* counts = nullptr;           // [E] routes per expert (zeroed by the launcher; may exceed capacity)
  bool counts_zeroed = false;          // counts are already 0 on the stream (router_topk's counts): no memset
  int32_t* route_of_slot = nullptr;    // [E, capacity] route id r = token·topk + j of each filled slot
  // [T, topk] slot of each route inside its expert (route_of_slot inverted), −1 when dropped; or
  // nullptr. What moe_combine and the route-indexed swiglu_quant read.
  int32_t* slot_of_route = nullptr;
};

// Slot order inside an expert is the atomic (native) order; a route's values do not depend on it.
// Routes beyond `capacity` are counted and dropped (the GEMM clamps counts to capacity).
// Errors: K not a multiple of 32, K_pad not a multiple of 256 or < K, bad sizes, unknown layout.
void act_dispatch(const DispatchArgs& args, cudaStream_t stream);
void act_dispatch_check(const DispatchArgs& args);  // the launcher's argument checks (shared by the ref)

// The CPU twin on HOST pointers: counts zeroed, then the routes in ascending route id (the canonical
// slot order), each row through act_quant_row_ref (act_quant_row_f32_ref on x + x_lo in fp32 when x_lo
// and quantize), zero past K up to K_pad. Slots no route fills are untouched. Errors: the launcher's,
// and an expert id outside [0, E) (which the device skips).
void act_dispatch_ref(const DispatchArgs& args);

// act_dispatch_ref into a fresh ActBatch (x zero, 1/γ_a = 1, route_of_slot −1 where no route lands;
// K_pad = padded_k(K)): x [T, K] bf16 bits, topk_ids [T, topk] expert ids in [0, E). Errors: bad
// sizes, an id out of range, the launcher's checks.
ActBatch act_dispatch_batch_ref(const uint16_t* x, int64_t T, int64_t K, const int32_t* topk_ids, int topk,
                                int num_experts, int capacity, bool quantize,
                                format::ActLayout layout = format::ActLayout::kMmaFragment);

}  // namespace moesq::ops
