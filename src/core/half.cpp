// IEEE binary16 conversions; bit manipulation so results do not depend on the host's _Float16.
#include "core/half.h"

namespace moesq {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    mag = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    mag = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  }
  uint32_t u;
  std::memcpy(&u, &mag, 4);
  u |= sign;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00;
  if (a >= 65520.0f) return sign | 0x7c00;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {          // subnormal: quantum 2^-24
    const float q = std::nearbyint(a * std::ldexp(1.0f, 24));  // default rounding: ties to even
    return sign | static_cast<uint16_t>(q);
  }
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const float quantum = std::ldexp(1.0f, e - 11);
  float r = std::nearbyint(a / quantum) * quantum;
  std::frexp(r, &e);
  const uint32_t exp = static_cast<uint32_t>(e - 1 + 15);
  const uint32_t man = static_cast<uint32_t>(std::ldexp(r, -(e - 1)) * 1024.0f) - 1024u;
  return sign | static_cast<uint16_t>((exp << 10) | man);
}

}  // namespace moesq
