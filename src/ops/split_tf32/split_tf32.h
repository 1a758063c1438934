// Launcher: fp32 values split into two TF32 parts, x ≈ hi + lo — the operands of an fp32-accurate GEMM
// on TF32 tensor cores (compress/cuda_context.cuh's sgemm_3xtf32: A·B ≈ A_lo·B_hi + A_hi·B_lo +
// A_hi·B_hi, each product of TF32 values exact in the tensor cores' fp32 accumulator):
//   hi = tf32(x), lo = tf32(x − hi)   (tf32: round to nearest even at the 10th mantissa bit; x − hi is
//   exact in fp32), so |x − hi − lo| ≤ 2⁻²² |x| for normal x (the dropped lo·lo term is as small) and
//   ≤ 2⁻¹³⁷ for subnormal x (TF32 keeps the top 10 of the encoding's 23 mantissa bits there too).
// Infinities and NaNs pass through hi (lo = 0), so a non-finite input stays non-finite in the GEMM.
// CPU twin: split_tf32_ref (the same bit operations, tf32_round.h).
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct SplitTf32Args {
  const float* x = nullptr;  // [n] fp32
  int64_t n = 0;
  float* hi = nullptr;       // [n] out: TF32-exact fp32 values
  float* lo = nullptr;       // [n] out: TF32-exact fp32 values
};

// Errors (moesq::Error): n < 0, a null pointer with n > 0.
void split_tf32(const SplitTf32Args& a, cudaStream_t stream);
void split_tf32_check(const SplitTf32Args& a);
void split_tf32_ref(const SplitTf32Args& a);

}  // namespace moesq::ops
