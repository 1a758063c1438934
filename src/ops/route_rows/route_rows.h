// Launcher: the routed rows of an EXPERT-PARALLEL MoE layer (docs/PARALLEL.md "The expert-parallel
// engine"). Every rank routes all T tokens the same way, but runs the grouped GEMMs of its own experts
// [expert_begin, expert_end) only; the expert outputs then travel between ranks in route-major order:
//
//   pack    routes[q, :] = y[e_q, slot_q, :]   for the routes q = t·k + j of this rank's experts
//           routes[q, :] = 0x0000 (all bits 0)  for every other route (another rank's, or dropped)
//   (the exchange: an all-reduce SUM of `routes` as uint32 words over the ranks, NCCL's ncclUint32:
//    each row has exactly one owner, every other rank adds 0, and an integer sum is exact, so every
//    rank receives the owner's bits, −0 and NaN included: route_rows_sum_ref is its twin)
//   unpack  y[e_q, slot_q, :] = routes[q, :]   for every kept route q (all experts)
//
// after which ops::moe_combine reads y exactly as on one GPU, so an expert-parallel layer gives the
// bits of the whole layer on one GPU (the expert GEMMs are batch-invariant: a row's bits do not depend
// on which other rows share its GEMM). The bytes exchanged are T·k·H·2 per rank, route-major, not
// [E, capacity, H].
// CPU twin: route_rows_ref, bitwise equal (copies only).
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct RouteRowsArgs {
  uint16_t* y = nullptr;                  // [E, capacity, ldy] bf16 expert outputs: read (pack), written (unpack)
  int64_t ldy = 0;
  const int32_t* topk_ids = nullptr;      // [T, k] expert of each route
  const int32_t* slot_of_route = nullptr; // [T, k] its slot in the expert (act_dispatch), < 0: dropped
  uint16_t* routes = nullptr;             // [T·k, H] bf16 route-major rows: written (pack), read (unpack)
  int64_t T = 0, H = 0;                   // H even: a uint32 word never straddles two routes' rows
  int topk = 0, num_experts = 0, capacity = 0;
  int64_t expert_begin = 0, expert_end = 0;  // pack: this rank's experts (dist::engine_expert_range)
  bool pack = true;                       // false: unpack
};

// Errors (moesq::Error): bad sizes (H or ldy odd, ldy < H, k outside [1, 32], an expert range outside
// [0, E]), a null pointer; the twin also a route's expert id or slot out of range (the kernel treats
// such a route as dropped).
void route_rows(const RouteRowsArgs& a, cudaStream_t stream);
void route_rows_ref(const RouteRowsArgs& a);  // host pointers
void route_rows_check(const RouteRowsArgs& a);

// The exchange's twin: out = Σ_r parts[r] as uint32 words (`words` = T·k·H/2), the all-reduce each
// rank's NCCL call performs. Error when a word has two non-zero contributors (a route packed by two
// ranks: a partition that is not one), naming the word's route row.
void route_rows_sum_ref(const uint16_t* const* parts, int num_ranks, int64_t words, int64_t H, uint16_t* out);

}  // namespace moesq::ops
