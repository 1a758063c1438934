// Round-to-nearest-even of an fp32 value to TF32 (1 sign, 8 exponent, 10 mantissa bits; the low 13
// bits of the fp32 encoding cleared), written once for the host and the device (ops/split_tf32).
// Infinities and NaNs are returned unchanged; a finite value that rounds past FLT_MAX becomes ±inf.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MOESQ_TF32_HD __host__ __device__ __forceinline__
#else
#define MOESQ_TF32_HD inline
#endif

namespace moesq::ops {

MOESQ_TF32_HD uint32_t tf32_round_bits(uint32_t u) {
  if ((u & 0x7f800000u) == 0x7f800000u) return u;  // inf / NaN
  const uint32_t lsb = (u >> 13) & 1u;             // ties to even
  return (u + 0x0fffu + lsb) & 0xffffe000u;
}

MOESQ_TF32_HD uint32_t tf32_float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

MOESQ_TF32_HD float tf32_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

MOESQ_TF32_HD float tf32_round(float x) { return tf32_bits_float(tf32_round_bits(tf32_float_bits(x))); }

// x ≈ hi + lo, both TF32-exact (split_tf32.h); a non-finite x (or one rounding past FLT_MAX) gives
// hi = that non-finite value and lo = 0.
MOESQ_TF32_HD void tf32_split(float x, float& hi, float& lo) {
  const uint32_t h = tf32_round_bits(tf32_float_bits(x));
  hi = tf32_bits_float(h);
  lo = (h & 0x7f800000u) == 0x7f800000u ? 0.0f : tf32_round(x - hi);  // x − hi is exact in fp32
}

}  // namespace moesq::ops
