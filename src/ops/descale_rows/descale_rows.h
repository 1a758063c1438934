// Launcher: divide the rows of an fp32 GEMM output by the NVFP4 tensor scales of its two operands —
// the epilogue of a GEMM over unscaled NVFP4 operands (ops/fake_quant's unscaled_bf16: dec(E2M1)·UE4M3,
// exact in bf16), which makes C = (A_u·B_uᵀ) / γ_A,row / γ_B the GEMM of the fake-quantized values
// A_u/γ_A and B_u/γ_B with exact products (Eq. 3 / Eq. 4 operands of the refinement's forward):
//   x[r, c] = (x[r, c] / row_gamma[r]) / gamma[0]       (two fp32 divisions, round to nearest)
// A row γ of 0 marks a padding row (gathered as zeros; a real γ is > 0, fake_quant.h): its row is set
// to 0 instead of 0/0.
// CPU twin: descale_rows_ref (the same expression: bit-exact).
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

// One value: (x / row_gamma) / gamma, or 0 for a padding row (row_gamma 0). Shared by the kernel, the
// twin and the consumers that fuse the division into their own reads (swiglu_train, weighted_mse).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline float descale_value(float x, float row_gamma, float gamma) {
  return row_gamma == 0.0f ? 0.0f : (x / row_gamma) / gamma;
}

struct DescaleRowsArgs {
  float* x = nullptr;                // [rows, C] fp32, in place
  int64_t rows = 0, C = 0;
  const float* row_gamma = nullptr;  // [rows] γ of each row's left operand (per-row Q_a)
  const float* gamma = nullptr;      // [1] γ of the right operand (Q_w's tensor scale)
};

// Errors (moesq::Error): rows < 0, C <= 0, a null pointer.
void descale_rows(const DescaleRowsArgs& a, cudaStream_t stream);
void descale_rows_check(const DescaleRowsArgs& a);
void descale_rows_ref(const DescaleRowsArgs& a);

}  // namespace moesq::ops
