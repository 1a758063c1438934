// Scalar codecs for the OCP micro-float formats used by NVFP4 (DESIGN.md §3):
//   E2M1  (4 bits: sign bit 3, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6), the value grid;
//   E4M3  (8 bits, "fn": no infinities, max 448, codes 0x7f/0xff are NaN), the block-scale grid;
//   UE4M3 (E4M3 restricted to non-negative values) for block scales.
// Encoders round to nearest, ties to even code, and SATURATE at the largest finite magnitude
// (6 / 448); they never produce a NaN code (a NaN input encodes as +0). Oracle: tests/fixtures/
// codec_vectors.json (ml_dtypes 0.6.0).
#pragma once
#include <cstdint>

namespace moesq::format {

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;

uint8_t e2m1_encode(float x);  // → code in [0, 15]
float e2m1_decode(uint8_t code);
uint8_t e4m3_encode(float x);  // → byte; saturating, never NaN
float e4m3_decode(uint8_t code);  // NaN for 0x7f / 0xff
uint8_t ue4m3_encode(float x);    // x < 0 or NaN → 0; else e4m3_encode
inline float round_e2m1(float x) { return e2m1_decode(e2m1_encode(x)); }
inline float round_e4m3(float x) { return e4m3_decode(e4m3_encode(x)); }

}  // namespace moesq::format
