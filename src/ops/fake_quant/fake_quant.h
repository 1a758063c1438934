// Launcher: NVFP4 fake quantization (quantize, then dequantize) in place on the GPU — the Q_w of
// Eq. 3 on a soft-masked weight tensor (one tensor scale γ over the whole tensor, Eq. 5) and the
// Q_a of Eq. 4 on activation rows (one γ per row), both with UE4M3 codes per `block` values.
// Bit-exact with format::nvfp4_fake_quant_blocks / format::quantize_activation_row (the same fp32
// expressions in the same order, ops/common/nvfp4_row.cuh's codecs). CPU twin: fake_quant_ref.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct FakeQuantArgs {
  float* x = nullptr;          // [rows, K] fp32, quantized in place
  int64_t rows = 0, K = 0;     // K % block == 0
  int block = 32;              // values per UE4M3 code: 32 (paired 4:8, activations) or 16 (dense NVFP4)
  bool per_row = false;        // true: γ per row from the row's amax (Q_a); false: one γ from amax(x) (Q_w)
  float* amax = nullptr;       // [1] device scratch (per_row = false): amax(x) is reduced here
  int32_t* nonfinite = nullptr;  // [1] optional: set to 1 when x holds a NaN or an infinity (the values
                                 // are then unspecified; the CPU functions throw instead)
  // Optional, for GEMMs on bf16 tensor cores that lose nothing: each value before the division by γ,
  // dec(E2M1 code)·dec(UE4M3 scale) (≤ 6 significant bits: exact in bf16), as bf16 bits [rows, K], and
  // γ ([rows] per_row, [1] otherwise). x = float(unscaled) / γ bit for bit, so a GEMM of unscaled
  // operands divided by the two γ afterwards (ops/descale_rows) is the fp32 GEMM of x without rounding
  // of the products. Both or neither.
  uint16_t* unscaled_bf16 = nullptr;
  float* gamma = nullptr;
  // A tensor γ only (per_row = false): *amax already holds amax(|x|), reduced by the producer of x
  // (ops/gumbel_support's amax, which also raised the non-finite flag): no amax pass, no check here.
  bool amax_given = false;
  // false: x is read only — the caller needs only unscaled_bf16 and gamma (then required) — which
  // saves the fp32 stores and their divisions by γ.
  bool write_x = true;
};

// Errors (moesq::Error): bad sizes, block not 16 or 32, K % block != 0, a null pointer; a tensor scale
// (per_row = false) on the GPU also needs x 16-byte aligned.
void fake_quant(const FakeQuantArgs& a, cudaStream_t stream);
void fake_quant_check(const FakeQuantArgs& a);

// The CPU twin on host pointers (`amax` may be null here): format::nvfp4_fake_quant_blocks with
// γ = nvfp4_tensor_scale(amax(x)), or format::quantize_activation_row per row; a non-finite entry sets
// *nonfinite (when given) and leaves x unchanged instead of throwing.
void fake_quant_ref(const FakeQuantArgs& a);

}  // namespace moesq::ops
