// Launcher: grouped sparse GEMM for paired 4:8 NVFP4 experts on Hopper sparse tensor cores, fp32
// accumulation, two kernels behind one entry point: mma.sp::ordered_metadata m16n8k32 bf16 (warp
// tiles, sparse_gemm_mma.cu; the memory-bound small-N regime) and wgmma.mma_async.sp m64nNk32 bf16
// (sparse_gemm_wgmma.cu; sm_90a, 2 warpgroups, A from registers; the compute-bound regime). For every expert e, in one launch:
//   Y_e[slot, m] = α(e, m, slot) · Σ_k Ŵ_e[m, k] · X̂_e[slot, k],   α = (1/γ_w[e, m]) · (1/γ_a[e, slot])
// where 1/γ_w[e, m] is w_inv_gamma[e], or w_inv_gamma_hi[e] for rows m ≥ m_split when that is given
// (a fused gate|up whose halves carry their own γ, as the paper's reference writes them).
// i.e. Y_eᵀ = W_e X_eᵀ with W on the sparse A operand (DESIGN.md §4, paper §3.4). CPU twin:
// sparse_gemm_ref (sparse_gemm_ref.cpp), same descriptor on host pointers. Weights: format::KernelWeights;
// activations: ops::ActBatch layout.
#pragma once
#include "core/cuda/stream.h"

#include <cstdint>
#include <string>

#include "format/kernel_layout.h"
#include "ops/swiglu_quant/swiglu_quant.h"

namespace moesq::ops {

struct SparseGemmArgs {
  const uint8_t* w = nullptr;            // [E, M_pad/16, K_pad/256, 1408] kernel-layout packed weights
  const float* w_inv_gamma = nullptr;    // [E] 1/γ_w
  // [E] 1/γ_w of rows m >= m_split (m_split a multiple of 16 in (0, M)), or nullptr: every row uses
  // w_inv_gamma. The product α is formed in the same order either way, so rows below m_split (and every
  // row without it) are bitwise what they were.
  const float* w_inv_gamma_hi = nullptr;
  int64_t m_split = 0;
  const uint16_t* x = nullptr;           // [E, capacity, K_pad] bf16 activations, kernel K order
  format::ActLayout x_layout = format::ActLayout::kMmaFragment;  // must equal sparse_gemm_act_layout(config)
  const float* x_inv_scale = nullptr;    // [E, capacity] 1/γ_a, or nullptr for 1 (W4A16)
  const int32_t* counts = nullptr;       // [E] device token counts (clamped to capacity)
  uint16_t* y = nullptr;                 // [E, capacity, ldy] bf16 output, or nullptr
  float* y_f32 = nullptr;                // [E, capacity, ldy] fp32 output (tests), or nullptr
  int num_experts = 0, capacity = 0;
  int64_t M = 0;                         // logical output rows (weight rows)
  int64_t M_pad = 0, K_pad = 0;          // as in KernelWeights
  int64_t ldy = 0;                       // output row stride in elements (≥ M)
  // The routes behind counts, or nullptr: [num_routes] expert ids of the whole layer (a route to expert
  // id i is this call's expert i − expert_begin when that is in [0, num_experts); others are ignored).
  // With them, decode-sized calls (capacity ≤ routes_max_tokens) run the routes kernel
  // (sparse_gemm_routes.cu): it finds the hit experts and starts streaming their weights before it
  // waits for the previous kernel (core/cuda/pdl.cuh), so route_experts must be written at least TWO
  // kernels before this launch on the stream (the dispatch sits between the routing and the GEMM) and
  // must agree with counts. Same bits as the mma.sp kernel.
  const int32_t* route_experts = nullptr;
  int64_t num_routes = 0;
  int expert_begin = 0;
  // Host pointer, or nullptr: the down GEMM's input made in the kernel — each routed row's SwiGLU
  // (+ requant) from fused_swiglu's gate|up rows, ops::swiglu_quant's arithmetic (its bits) — instead of
  // read from x / x_inv_scale, which swiglu_quant then need not write. Only where the routes kernel runs
  // (sparse_gemm_runs_routes); its I_pad = K_pad, capacity = capacity, layout kMmaFragment, its expert
  // ids the layer's (this call's expert e is its e + expert_begin).
  const SwigluQuantArgs* fused_swiglu = nullptr;
  // The largest capacity the routes kernel takes (≤ kRoutesMaxChunkedTokens): past kRoutesMaxTokens an
  // expert's rows go in chunks of 8, its weights streamed once per chunk. Same bits either way.
  int routes_max_tokens = 8;
};

constexpr int kRoutesMaxTokens = 8;  // the routes kernel's n8 tile of tokens per expert (one chunk)
constexpr int kRoutesMaxChunkedTokens = 64;  // the largest SparseGemmArgs::routes_max_tokens taken

enum class GemmVariant {
  kMmaSp,    // warp-level mma.sp m16n8k32; activations in format::ActLayout::kMmaFragment
  kWgmmaSp,  // warpgroup wgmma.mma_async.sp m64nNk32; activations in format::ActLayout::kKMajor
};

// Tile configuration: a CTA of `warps` warps owns BLOCK_M weight rows and BLOCK_N = 8·n_tiles tokens
// of one expert; CTAs loop persistently over (expert, m-block, n-block). Each kernel reads its own
// M-tile field:
//   kMmaSp:   BLOCK_M = warps·16·m16_tiles_per_warp (m16_tiles_per_warp × n_tiles ∈ 1×1, 2×1, 1×2,
//             2×2, 4×4 built);
//   kWgmmaSp: warps = 8 (2 warpgroups), BLOCK_M = 2·64·m64_tiles_per_warpgroup, n_tiles = BLOCK_N / 8,
//             stages = depth of the shared-memory activation pipeline. Built: 128×128, 128×256 and
//             256×128, each with 4 stages (sparse_gemm_wgmma.cu).
struct GemmConfig {
  GemmVariant variant = GemmVariant::kMmaSp;
  int m16_tiles_per_warp = 2;       // kMmaSp: m16 mma.sp tiles per warp
  int m64_tiles_per_warpgroup = 1;  // kWgmmaSp: m64 wgmma.sp tiles per warpgroup
  int n_tiles = 1;      // n8 tiles per warp (kWgmmaSp: per warpgroup)
  int warps = 4;
  int stages = 0;       // kWgmmaSp only
  int grid = 0;         // persistent CTAs (0: decided at launch from occupancy)
  std::string str() const;
};

// The wgmma.sp config with BLOCK_M weight rows × BLOCK_N tokens per tile and `stages` pipeline stages.
GemmConfig wgmma_config(int block_m, int block_n, int stages = 4);

// Activation layout the config's kernel reads (the dispatch / SwiGLU producers must write it).
format::ActLayout sparse_gemm_act_layout(const GemmConfig& config);

// Picks the tile config for a problem (max_tokens: the host's upper bound on any expert's count).
// Prints it to stderr when MOESQ_PRINT_CONFIG=1.
GemmConfig sparse_gemm_heuristic(int num_experts, int64_t M, int64_t K_pad, int max_tokens);

// Whether sparse_gemm(args, max_tokens, ·, config) runs the routes kernel (sparse_gemm_routes.cu),
// which alone takes fused_swiglu.
bool sparse_gemm_runs_routes(const SparseGemmArgs& args, int max_tokens, const GemmConfig* config = nullptr);

// Runs the GEMM. `config` nullptr → sparse_gemm_heuristic(…, max_tokens). Error for shapes it
// cannot run (never a wrong answer): E > 1024, unaligned K_pad/M_pad, no output, activations
// whose x_layout is not the one the chosen kernel reads, fused_swiglu where the routes kernel does not run.
void sparse_gemm(const SparseGemmArgs& args, int max_tokens, cudaStream_t stream, const GemmConfig* config = nullptr);

// The CPU twin on the same descriptor with HOST pointers: y_f32 (and/or y, the fp32 value rounded to
// bf16) for slots < min(count_e, capacity), other slots untouched. Weights are unpacked from the
// kernel-layout bytes (kDefaultMetaOrder), products summed in fp64 then rounded once to fp32, times
// α = (1/γ_w[e])·(1/γ_a[e, slot]) (x_inv_scale nullptr: 1). x is read through x_layout, so both
// layouts of the same tokens give bitwise the same y. Errors: the launcher's shape rules.
void sparse_gemm_ref(const SparseGemmArgs& args);

}  // namespace moesq::ops
