// Launcher: rows of a row-major fp32 matrix widened to fp64, each scaled by √w_t when row weights
// are given — the fp64 operand of a Hessian H = 2 Σ_t w_t x_t x_tᵀ / n (compress/hessian.h: the
// same widening as hessian_add_rows, out = √(double)w_t · (double)x), for cuBLAS's DSYRK.
// CPU twin: widen_f64_ref.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct WidenF64Args {
  const float* x = nullptr;  // [rows, K] fp32
  int64_t rows = 0, K = 0;
  const float* w = nullptr;  // optional [rows] row weights (>= 0); null: all 1
  double* out = nullptr;     // [rows, K] fp64
};

// Errors (moesq::Error): bad sizes, a null pointer.
void widen_f64(const WidenF64Args& a, cudaStream_t stream);
void widen_f64_check(const WidenF64Args& a);
void widen_f64_ref(const WidenF64Args& a);

}  // namespace moesq::ops
