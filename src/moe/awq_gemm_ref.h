// CPU reference of the packed-AWQ W4A16 MoE GEMM, following the kernel's decomposition exactly:
// tiles (MoE block p, N-tile n) in the order of an explicit TileSchedule; inside a tile, each slice
// sums its K-tiles as fp32 K-tile partial sums (sequential over the thread_k elements of a K-tile,
// then added to the slice accumulator in K-tile order); a split tile's slices are reduced in fp32 in
// slice order 0, 1, …, s−1; the result is rounded once to fp16.
//   C[r, n] = Σ_k A[row(r), k] · ŵ_e[n, k],   e = expert of r's block,  ŵ = (q − z)·s in fp16
// Products of two fp16 numbers are exact in fp32, so the only rounding choices are the additions —
// which is what the schedule selects (paper 000). Rows of a tile never interact: a route's result
// depends only on its own row and the schedule class of its tile.
// The one non-obvious decision: output rows are indexed by ROUTE id (vLLM's layout [M·k, N]), so a
// plan that moves a route moves only which arithmetic it gets, never where its result lands.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/align.h"
#include "moe/awq.h"
#include "moe/schedule.h"

namespace moesq::moe {

struct AwqMoeGemmDesc {
  const uint16_t* A = nullptr;  // [num_a_rows, K] fp16 input rows
  int64_t num_a_rows = 0;
  int a_row_div = 1;            // route r reads A row r / a_row_div (top-k for W13, 1 for W2)
  int64_t N = 0, K = 0;
  const RouteAlignment* align = nullptr;
  const std::vector<AwqLinear>* weights = nullptr;  // [E] per-expert AWQ weights, each [N, K]
  const TileSchedule* sched = nullptr;              // built for (align->num_blocks(), N, K)
  uint16_t* C = nullptr;        // [M·k, N] fp16 output, indexed by route id
  float* C_f32 = nullptr;       // optional [M·k, N]: the fp32 value before the fp16 rounding
};

// Checks the descriptor (shapes, schedule matches the plan, weights present for every active expert);
// Error names the field, N, K and the expert.
void awq_moe_gemm_check(const AwqMoeGemmDesc& d);
// The reference; tiles run in parallel (each tile's arithmetic is independent of the thread count).
void awq_moe_gemm_ref(const AwqMoeGemmDesc& d);

}  // namespace moesq::moe
