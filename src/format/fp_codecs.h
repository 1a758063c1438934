// Scalar codecs for the OCP micro-float formats used by NVFP4 (DESIGN.md §3):
//   E2M1  (4 bits: sign bit 3, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6), the value grid;
//   E4M3  (8 bits, "fn": no infinities, max 448, codes 0x7f/0xff are NaN), the block-scale grid;
//   UE4M3 (E4M3 restricted to non-negative values) for block scales.
// Encoders round to nearest, ties to even code, and SATURATE at the largest finite magnitude
// (6 / 448); they never produce a NaN code. E2M1 has no NaN: a NaN input is an Error (callers check
// their rows first and name the tensor or activation; the throw here is the last line of defence so
// no NaN ever becomes a finite +0). Oracle: tests/fixtures/codec_vectors.json (ml_dtypes 0.6.0).
#pragma once
#include <cmath>
#include <cstdint>

namespace moesq::format {

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;

[[noreturn]] void throw_e2m1_nan();  // cold path of e2m1_encode (fp_codecs.cpp)

// E2M1 is inline: it runs once per value on the hot paths (activation quantization of every
// expert row, fake quant in the refinement forward).
inline uint8_t e2m1_encode(float x) {  // → code in [0, 15]
  if (std::isnan(x)) [[unlikely]] throw_e2m1_nan();  // never a silent +0
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // The code is the number of midpoints |x| lies beyond; at an exact midpoint the EVEN code wins
  // (<= vs <): 0.25 → code 0, 0.75 → 2, 1.25 → 2, 1.75 → 4, 2.5 → 4, 3.5 → 6, 5 → 6; > 5 → 7 (6).
  // A sum of comparisons: no data-dependent branches.
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(sign | code);
}
inline float e2m1_decode(uint8_t code) {
  constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 0xf];
}
uint8_t e4m3_encode(float x);  // → byte; saturating, never NaN
float e4m3_decode(uint8_t code);  // NaN for 0x7f / 0xff
uint8_t ue4m3_encode(float x);    // x < 0 or NaN → 0; else e4m3_encode
inline float round_e2m1(float x) { return e2m1_decode(e2m1_encode(x)); }
inline float round_e4m3(float x) { return e4m3_decode(e4m3_encode(x)); }

}  // namespace moesq::format
