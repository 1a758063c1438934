// Launchers: the SwiGLU of the refinement objective (compress/refine/objective.h), forward and
// backward, on fp32 rows of the gate|up GEMM output a|b [rows, 2I] (a = columns [0, I), b = [I, 2I)):
//   forward:  h = a · σ(a) · b (core/swiglu.h silu_mul_with_sigmoid, its fp32 order), then, with
//             quantize, Q_a of Eq. 4 per row (fake_quant's per-row NVFP4, straight-through below);
//   backward: da = dh · b · σ(a) · (1 + a(1 − σ(a))),  db = dh · a · σ(a).
// CPU twins (`_ref`) on the same descriptors. Plain SwiGLU only: gpt-oss's biased, clamped variant
// runs on the CPU refinement.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct SwigluTrainArgs {
  int64_t rows = 0, I = 0;      // I % block == 0 when quantize
  const float* ab = nullptr;    // [rows, 2I] a|b
  float* h = nullptr;           // forward out [rows, I]
  bool quantize = true;         // forward: Q_a on h (per-row γ, `block`-value UE4M3 codes)
  int block = 32;
  int32_t* nonfinite = nullptr; // [1] optional: set to 1 when h holds a NaN or an infinity
  uint16_t* h_unscaled_bf16 = nullptr;  // forward with quantize, optional: Q_a(h) before the division by
  float* h_gamma = nullptr;             // its row γ, as bf16 bits [rows, I], and the γ [rows] (fake_quant.h)
  // Forward, optional, all three or none: ab is a raw GEMM output over unscaled NVFP4 operands; the
  // forward reads a|b as ops::descale_value(ab, ab_row_gamma[r], *ab_gamma) (ops/descale_rows.h) and
  // writes the descaled a|b to ab_out (may be ab itself) for the backward — the descale pass fused.
  const float* ab_row_gamma = nullptr;
  const float* ab_gamma = nullptr;
  float* ab_out = nullptr;
  const float* dh = nullptr;    // backward in [rows, I]
  float* dab = nullptr;         // backward out [rows, 2I] da|db
};

// Errors (moesq::Error): bad sizes, a null pointer.
void swiglu_train_forward(const SwigluTrainArgs& a, cudaStream_t stream);
void swiglu_train_backward(const SwigluTrainArgs& a, cudaStream_t stream);
void swiglu_train_check(const SwigluTrainArgs& a, bool backward);  // the launchers' checks
void swiglu_train_forward_ref(const SwigluTrainArgs& a);
void swiglu_train_backward_ref(const SwigluTrainArgs& a);

}  // namespace moesq::ops
