// Launcher: grouped sparse GEMM for paired 4:8 NVFP4 experts on Hopper sparse tensor cores
// (mma.sp::ordered_metadata m16n8k32 bf16, fp32 accumulation). For every expert e, in one launch:
//   Y_e[slot, m] = α(e, slot) · Σ_k Ŵ_e[m, k] · X̂_e[slot, k],   α = (1/γ_w[e]) · (1/γ_a[e, slot])
// i.e. Y_eᵀ = W_e X_eᵀ with W on the sparse A operand (DESIGN.md §4, paper §3.4). CPU twin:
// moe::grouped_sparse_gemm_ref. Weights: moe::KernelWeights; activations: moe::ActBatch layout.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace moesq::cuda {

struct SparseGemmArgs {
  const uint8_t* w = nullptr;            // [E, M_pad/16, K_pad/256, 1408] kernel-layout packed weights
  const float* w_inv_gamma = nullptr;    // [E] 1/γ_w
  const uint16_t* x = nullptr;           // [E, capacity, K_pad] bf16 activations, kernel K order
  const float* x_inv_scale = nullptr;    // [E, capacity] 1/γ_a, or nullptr for 1 (W4A16)
  const int32_t* counts = nullptr;       // [E] device token counts (clamped to capacity)
  uint16_t* y = nullptr;                 // [E, capacity, ldy] bf16 output, or nullptr
  float* y_f32 = nullptr;                // [E, capacity, ldy] fp32 output (tests), or nullptr
  int num_experts = 0, capacity = 0;
  int64_t M = 0;                         // logical output rows (weight rows)
  int64_t M_pad = 0, K_pad = 0;          // as in KernelWeights
  int64_t ldy = 0;                       // output row stride in elements (≥ M)
};

// Tile configuration: a CTA of `warps` warps owns BLOCK_M = warps·16·m_tiles rows and
// BLOCK_N = 8·n_tiles tokens of one expert; CTAs loop persistently over (expert, m-block, n-block).
struct GemmConfig {
  int m_tiles = 2;      // m16 tiles per warp
  int n_tiles = 1;      // n8 tiles per warp
  int warps = 4;
  int grid = 0;         // persistent CTAs (0: decided at launch from occupancy)
  std::string str() const;
};

// Picks the tile config for a problem (max_tokens: the host's upper bound on any expert's count).
// Prints it to stderr when MOESQ_PRINT_CONFIG=1.
GemmConfig sparse_gemm_heuristic(int num_experts, int64_t M, int64_t K_pad, int max_tokens);

// Runs the GEMM. `config` nullptr → sparse_gemm_heuristic(…, max_tokens). Error for shapes it
// cannot run (never a wrong answer): E > 1024, unaligned K_pad/M_pad, no output.
void sparse_gemm(const SparseGemmArgs& args, int max_tokens, cudaStream_t stream, const GemmConfig* config = nullptr);

}  // namespace moesq::cuda
