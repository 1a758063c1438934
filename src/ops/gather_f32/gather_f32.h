// Launcher: gather rows of a row-major fp32 matrix by index — a refinement batch (the shuffled
// training rows of one step, or a chunk of held-out rows) made contiguous for the GEMMs:
//   out[i, :] = src[idx[i], :] for idx[i] >= 0, zeros for idx[i] < 0 (padding rows).
// CPU twin: gather_f32_ref.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct GatherF32Args {
  const float* src = nullptr;    // [src_rows, C]
  int64_t src_rows = 0, C = 0;
  const int64_t* idx = nullptr;  // [m] row ids in [0, src_rows), or < 0 for a zero row
  int64_t m = 0;
  float* out = nullptr;          // [m, C]
};

// Errors (moesq::Error): bad sizes, a null pointer; the twin also an index >= src_rows (the kernel
// writes zeros for it).
void gather_f32(const GatherF32Args& a, cudaStream_t stream);
// n (1 to 8) gathers in ONE launch (a refinement step's X, its unscaled bf16 copy, γ, Y_ref and w by the
// same batch indices): the same bytes as n single launches.
void gather_f32(const GatherF32Args* a, int n, cudaStream_t stream);
void gather_f32_check(const GatherF32Args& a);
void gather_f32_ref(const GatherF32Args& a);

}  // namespace moesq::ops
