// 16-bit floats: bf16 and IEEE f16 conversions (round to nearest even, NaN kept quiet).
// Weights are stored as bf16; all math is fp32 (DESIGN.md §1).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace moesq {

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

// Rounds an fp32 value to the nearest bf16 value, returned as fp32.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace moesq
