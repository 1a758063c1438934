// Launcher: the weighted scatter-add of one expert's outputs into the MoE block's output rows — the
// combine of DecoderModel::moe_block, one expert at a time, on the GPU (compress/layer_cuda):
//   y[idx[i], :] = y[idx[i], :] + (w[i] · src[i, :])   for i in [0, m),
// each product rounded to fp32, then the sum (no FMA), the same two roundings as the CPU combine.
// The indices must be distinct (one expert receives a token at most once): rows are independent, so
// the result does not depend on the launch; calling it for the experts in ascending order reproduces
// the CPU's per-token summation order. CPU twin: scatter_add_f32_ref.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct ScatterAddF32Args {
  const float* src = nullptr;    // [m, C] fp32
  const float* w = nullptr;      // [m] fp32 weight of each source row
  const int64_t* idx = nullptr;  // [m] distinct destination rows in [0, y_rows)
  int64_t m = 0, C = 0;
  float* y = nullptr;            // [y_rows, C] fp32, accumulated in place
  int64_t y_rows = 0;
};

// Errors (moesq::Error): bad sizes, a null pointer; the twin also an index outside [0, y_rows) or a
// repeated index (the kernel skips an index outside the rows; a repeat is a race there).
void scatter_add_f32(const ScatterAddF32Args& a, cudaStream_t stream);
void scatter_add_f32_check(const ScatterAddF32Args& a);
void scatter_add_f32_ref(const ScatterAddF32Args& a);

}  // namespace moesq::ops
