// Packed-AWQ W4A16 MoE GEMM (DESIGN.md §6): one descriptor per side, one schedule (awq_schedule.h).
//   C[r, n] = Σ_k A[r / a_row_div, k] · ŵ_e[n, k]   for every valid route r of every MoE block, e the
//   block's expert, ŵ = (q − z)·s in fp16 (exact), output indexed by route id.
// CPU twin ops::awq_moe_gemm_ref (awq_gemm_ref.cpp): host descriptor AwqMoeGemmDesc, the kernel's exact
// decomposition. CUDA (awq_gemm.cu): dequantizes in registers/shared memory to fp16 (as Marlin does),
// fp16 tensor cores (mma.sync m16n8k16) with fp32 accumulation, the same tiles, the same K-tile partial
// sums and the same slice reduction order; ops::awq_moe_gemm_cuda_host runs it on the host descriptor.
// Why two descriptors (the other ops share one between launcher and twin): the twin reads per-expert
// format::AwqLinear objects, the form the audit keeps its experts in, while the kernel reads slot-packed
// device arrays; one pointer descriptor for both needs the audit to store its experts slot-packed too.
// awq_moe_gemm_cuda_host is the bridge (the kernel on the twin's descriptor).
//
// The reference follows the kernel's decomposition exactly:
// tiles (MoE block p, N-tile n) in the order of an explicit TileSchedule; inside a tile, each slice
// sums its K-tiles as fp32 K-tile partial sums (sequential over the thread_k elements of a K-tile,
// then added to the slice accumulator in K-tile order); a split tile's slices are reduced in fp32 in
// slice order 0, 1, …, s−1; the result is rounded once to fp16.
// Products of two fp16 numbers are exact in fp32, so the only rounding choices are the additions —
// which is what the schedule selects (paper 000). Rows of a tile never interact: a route's result
// depends only on its own row and the schedule class of its tile.
// The one non-obvious decision: output rows are indexed by ROUTE id (vLLM's layout [M·k, N]), so a
// plan that moves a route moves only which arithmetic it gets, never where its result lands.
#pragma once
#include <cstdint>
#include <vector>

#include "core/cuda/stream.h"
#include "format/awq_int4.h"
#include "ops/awq_gemm/awq_schedule.h"
#include "ops/route_align/route_align.h"

struct __half;  // cuda_fp16.h; the CPU build sees only pointers to it

namespace moesq::ops {

struct AwqMoeGemmDesc {
  const uint16_t* A = nullptr;  // [num_a_rows, K] fp16 input rows
  int64_t num_a_rows = 0;
  int a_row_div = 1;            // route r reads A row r / a_row_div (top-k for W13, 1 for W2)
  int64_t N = 0, K = 0;
  const RouteAlignment* align = nullptr;
  const std::vector<format::AwqLinear>* weights = nullptr;  // [E] per-expert AWQ weights, each [N, K]
  const TileSchedule* sched = nullptr;              // built for (align->num_blocks(), N, K)
  uint16_t* C = nullptr;        // [M·k, N] fp16 output, indexed by route id
  float* C_f32 = nullptr;       // optional [M·k, N]: the fp32 value before the fp16 rounding
};

// Checks the descriptor (shapes, schedule matches the plan, weights present for every active expert);
// Error names the field, N, K and the expert.
void awq_moe_gemm_check(const AwqMoeGemmDesc& d);
// The reference; tiles run in parallel (each tile's arithmetic is independent of the thread count).
void awq_moe_gemm_ref(const AwqMoeGemmDesc& d);


struct AwqMoeGemmCudaDesc {
  const __half* A = nullptr;          // [num_a_rows, K] fp16
  int a_row_div = 1;                  // route r reads A row r / a_row_div
  const int32_t* sorted_ids = nullptr;    // [P · b] route ids, sentinel on padding rows
  const int32_t* block_expert = nullptr;  // [P]
  const int32_t* expert_slot = nullptr;   // [E] index into the weight arrays, −1 = not loaded
  int32_t sentinel = 0;               // M · k
  int block_size = 8;                 // b: rows per MoE block (must be 8: the mma N dimension)
  const int32_t* qweight = nullptr;   // [slots, K, N/8] int32, AWQ nibble order
  const int32_t* qzeros = nullptr;    // [slots, K/128, N/8] int32
  const __half* scales = nullptr;     // [slots, K/128, N] fp16
  __half* C = nullptr;                // [M·k, N] fp16, by route id
  float* workspace = nullptr;         // [awq_workspace_floats(sched)] fp32 slice partials
  ops::TileSchedule sched;            // grid, tiles, slices (N, K, thread_k, thread_n inside)
};

// fp32 workspace the split-K remainder needs: split_tiles · slices · 8 · thread_n (0 without reduction).
int64_t awq_workspace_floats(const ops::TileSchedule& s);
// Whether the kernel supports the config: b == 8, thread_n ∈ {64, 128}, thread_k % 16 == 0, ≤ 128,
// and thread_k divides 128 (one AWQ group per K-tile). Otherwise use ops::awq_moe_gemm_ref.
bool awq_gemm_cuda_supported(const ops::TileSchedule& s, int block_size);
// Resident CUDA blocks per SM of the main kernel for thread_n (occupancy API), for the default grid.
int awq_gemm_blocks_per_sm(int thread_n, int thread_k);
// Launches the main kernel (grid = sched.grid) and, when slices > 1, the fixed-order reduction.
void awq_moe_gemm_cuda(const AwqMoeGemmCudaDesc& d, cudaStream_t stream);

// The CUDA GEMM on the `_ref`'s HOST descriptor (awq_gemm_host.cu: uploads, runs awq_moe_gemm_cuda,
// downloads), so it can stand in for ops::awq_moe_gemm_ref. Falls back to ops::awq_moe_gemm_ref for
// configs the kernel does not support. The fp32 capture C_f32 exists only in the `_ref`.
void awq_moe_gemm_cuda_host(const ops::AwqMoeGemmDesc& d);

}  // namespace moesq::ops
