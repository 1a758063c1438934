// Packed-AWQ W4A16 MoE GEMM on CUDA with the explicit tile schedule of moe/schedule.h (DESIGN.md §6).
// C[r, n] = Σ_k A[r / a_row_div, k] · ŵ_e[n, k] for every valid route r of every MoE block, e the
// block's expert, ŵ = (q − z)·s dequantized in registers/shared memory to fp16 (exact, as Marlin does),
// fp16 tensor cores (mma.sync m16n8k16) with fp32 accumulation, fp16 output indexed by route id.
// CPU twin: moe::awq_moe_gemm_ref (same tiles, same K-tile partial sums, same slice reduction order).
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "moe/schedule.h"

namespace moesq::cuda {

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
  moe::TileSchedule sched;            // grid, tiles, slices (N, K, thread_k, thread_n inside)
};

// fp32 workspace the split-K remainder needs: split_tiles · slices · 8 · thread_n (0 without reduction).
int64_t awq_workspace_floats(const moe::TileSchedule& s);
// Whether the kernel supports the config: b == 8, thread_n ∈ {64, 128}, thread_k % 16 == 0, ≤ 128,
// and thread_k divides 128 (one AWQ group per K-tile). Otherwise use moe::awq_moe_gemm_ref.
bool awq_gemm_cuda_supported(const moe::TileSchedule& s, int block_size);
// Resident CUDA blocks per SM of the main kernel for thread_n (occupancy API), for the default grid.
int awq_gemm_blocks_per_sm(int thread_n, int thread_k);
// Launches the main kernel (grid = sched.grid) and, when slices > 1, the fixed-order reduction.
void awq_moe_gemm_cuda(const AwqMoeGemmCudaDesc& d, cudaStream_t stream);

}  // namespace moesq::cuda
