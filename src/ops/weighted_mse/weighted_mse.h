// Launcher: the router-weighted reconstruction loss of Eq. 4 on a batch of expert outputs, and its
// gradient (compress/refine/objective.h):
//   r = ŷ − y_ref,  loss_i = w_i · Σ_o r_io²  (fp64 accumulation),  dŷ_io = fp32(2 · w_i · inv_norm) · r_io
// The caller scales Σ_i loss_i by inv_norm = 1 / (Σ_batch w · H). CPU twin: weighted_mse_ref.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct WeightedMseArgs {
  int64_t rows = 0, H = 0;
  const float* y = nullptr;      // [rows, H] the expert's output ŷ
  const float* y_ref = nullptr;  // [rows, H] the targets
  const float* w = nullptr;      // [rows] row weights g^p (0 for padding rows)
  double inv_norm = 0.0;         // 1 / (Σ_batch w · H)
  float* dy = nullptr;           // [rows, H] out (may be null: loss only)
  double* row_loss = nullptr;    // [rows] out: w_i · Σ_o r² (may be null: gradient only)
  // Optional, both or neither: y is a raw GEMM output over unscaled NVFP4 operands, read as
  // ops::descale_value(y, y_row_gamma[i], *y_gamma) (ops/descale_rows.h) — the descale pass fused.
  const float* y_row_gamma = nullptr;
  const float* y_gamma = nullptr;
};

// Errors (moesq::Error): bad sizes, a null input, both outputs null.
void weighted_mse(const WeightedMseArgs& a, cudaStream_t stream);
void weighted_mse_check(const WeightedMseArgs& a);
void weighted_mse_ref(const WeightedMseArgs& a);

}  // namespace moesq::ops
