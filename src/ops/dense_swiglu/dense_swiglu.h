// Launcher: the SwiGLU between the two GEMMs of a dense MLP on the GPU — a shared expert (DeepSeek-V3,
// Kimi-K2.5, Qwen2-MoE) or a dense layer's MLP (first_k_dense_replace, mlp_only_layers). From the
// gate|up GEMM's fp32 output row [gate (I) | up (I) | gate logit z (gated only)]:
//   a = silu(g) · u · s,  silu(g) = g / (1 + e^−g) (core/swiglu.h's order),  s = σ(z) when gated, else 1,
// written as bf16 hi + lo (the down GEMM's near-fp32 input, as the engine's other GEMM inputs).
// Folding σ(z) in before the down GEMM (transformers multiplies the shared expert's OUTPUT by it) is
// the same product up to fp32 rounding; each element depends on its row alone (batch-invariant).
// CPU twin: dense_swiglu_ref (std::exp where the kernel uses expf).
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct DenseSwigluArgs {
  const float* gu = nullptr;  // [T, ld] fp32: gate columns [0, I), up [I, 2I), gated: z at column 2I
  uint16_t* a = nullptr;      // [T, I] bf16 (silu(g)·u·s rounded)
  uint16_t* a_lo = nullptr;   // [T, I] bf16 of the rounding residue, or nullptr
  int64_t T = 0, I = 0, ld = 0;  // ld ≥ 2I (+1 gated)
  bool gated = false;
};

// Errors: I < 1, ld too small, T < 0, null pointers.
void dense_swiglu(const DenseSwigluArgs& args, cudaStream_t stream);
void dense_swiglu_ref(const DenseSwigluArgs& args);  // host pointers
void dense_swiglu_check(const DenseSwigluArgs& args);

}  // namespace moesq::ops
