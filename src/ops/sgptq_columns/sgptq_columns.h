// Launcher: one lazy-update block of SGPTQ's column loop (compress/sgptq.h; paper 002 §3.4 and
// Appendix B), for every row of a projection at once. Columns [b0, b1) of Wt [K, N] (the fp64
// transposed weights, as GPTQ updates them) are processed left to right; for each row r and column i:
//   * at each 32-column scale block start: the SparseGPT pair choice of the block's 4 groups on the
//     current weights (score Σ_{j∈pair} w_j² / U_jj², keep the 2 best pairs, ties → lower pattern id),
//     then the block's UE4M3 code c = UE4M3(γ · amax_kept / 6); at later group starts of the block the
//     group's pattern is chosen again (pattern_at_group);
//   * kept weights are rounded q = dec(E2M1(w·(γ/dec c)))·dec(c)/γ, pruned ones left as they are;
//   * e = (w − q) / U_ii goes to err (0 for i < gptq_from) and ½e² to row_loss[r];
//   * the block's later columns are updated: Wt[j, r] −= e · U_ij for i < j < b1.
// The caller applies the block's error to the columns after b1 (one GEMM, GPTQ's lazy update):
//   Wt[b1:K, :] −= U[b0:b1, b1:K]ᵀ · err.
// Rows are independent, so the kernel gives each row one thread; its `_ref` twin runs the same
// per-row code (sgptq_row.h) on the host, and both produce the same bits.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct SgptqColumnsArgs {
  int64_t N = 0, K = 0;          // the projection W [N, K]; K % 32 == 0
  int64_t b0 = 0, b1 = 0;        // this block's columns [b0, b1): b0 % 32 == 0, b1 % 32 == 0, b1 <= K
  double* Wt = nullptr;          // [K, N] fp64 transposed weights, updated in place
  const double* U = nullptr;     // [K, K] row-major upper Cholesky factor of H⁻¹ (H⁻¹ = UᵀU)
  float gamma = 0.0f;            // the tensor scale γ (> 0, finite)
  bool choose = true;            // SparseGPT support choice; false: `patterns` are given and kept
  bool pattern_at_group = true;  // choose each group's pattern at its own start (SgptqOptions)
  int64_t gptq_from = 0;         // columns < gptq_from are rounded without propagating their error
  uint8_t* patterns = nullptr;     // [N, K/8] pattern ids 0..5 (written when choose)
  uint8_t* scale_codes = nullptr;  // [N, K/32] UE4M3 codes (written)
  uint8_t* value_codes = nullptr;  // [N, K/2] one E2M1 code per byte, the kept values in group order (written)
  float* dense_rounded = nullptr;  // [N, K] kept: q; pruned: the updated weight (written)
  float* dequant = nullptr;        // optional [N, K]: kept: q, pruned: 0 (= sparse48_dequantize of the result)
  double* err = nullptr;           // [b1 − b0, N] out: e per column and row
  double* row_loss = nullptr;      // [N] in/out: += ½e² of every column, in column order
  int32_t* nonfinite = nullptr;    // optional [1]: set to 1 when an e is NaN or infinite
};

// Errors (moesq::Error): bad shapes or block bounds, a null pointer, γ not positive and finite.
void sgptq_columns(const SgptqColumnsArgs& a, cudaStream_t stream);
void sgptq_columns_check(const SgptqColumnsArgs& a);
// The CPU twin on host pointers: the same per-row code, row by row.
void sgptq_columns_ref(const SgptqColumnsArgs& a);

}  // namespace moesq::ops
