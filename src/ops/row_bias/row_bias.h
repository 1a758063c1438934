// Launcher: y[r, c] += bias[c] over an fp32 [rows, cols] matrix — the o_proj bias (gpt-oss) added to
// the residual stream after the o_proj GEMM accumulated into it. Elementwise, one fp32 add per value:
// the CPU twin row_bias_ref is bitwise equal.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct RowBiasArgs {
  float* y = nullptr;           // [rows, cols] fp32, updated in place
  const float* bias = nullptr;  // [cols] fp32
  int64_t rows = 0, cols = 0;
};
// Errors: negative sizes, a null pointer with rows·cols > 0.
void row_bias(const RowBiasArgs& args, cudaStream_t stream);
void row_bias_ref(const RowBiasArgs& args);  // host pointers
void row_bias_check(const RowBiasArgs& args);

}  // namespace moesq::ops
