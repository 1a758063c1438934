// E2M1 / E4M3 / UE4M3 scalar codecs (fp_codecs.h): round to nearest, ties to even code, saturating.
//
// Non-obvious decision: E4M3 encoding scales |x| by a power of two so that the 3 mantissa bits become
// the integer part, then rounds with std::nearbyint (the default FE_TONEAREST mode = ties to even).
// The power-of-two scaling is exact in fp32, so the single rounding is the correctly rounded E4M3
// value, and "ties to even mantissa" is "ties to even code" because the code is exponent·8 + mantissa.
// A carry out of the mantissa (q == 16) lands on the next exponent's code by the same arithmetic.
// Unlike ml_dtypes (overflow → NaN), values beyond 448 saturate to 448: a block scale must never be NaN.
#include "format/fp_codecs.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace moesq::format {

namespace {

// E2M1 magnitudes by code (bits 0–2); bit 3 is the sign.
constexpr float kE2M1Values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

constexpr uint8_t kE4M3MaxCode = 0x7e;  // 448 = 2^8 · 1.75: exponent 15, mantissa 6 (0x7f is NaN)
constexpr int kE4M3Bias = 7;
constexpr int kE4M3MinNormalExp = -6;   // smallest normal 2^-6; subnormal step 2^-9

}  // namespace

uint8_t e2m1_encode(float x) {
  if (std::isnan(x)) return 0;  // never produce a NaN-ish code: NaN → +0 (fp_codecs.h)
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  const float a = std::fabs(x);
  // Midpoints between neighbouring magnitudes; at an exact midpoint pick the EVEN code:
  // 0.25 → 0 (code 0), 0.75 → 1 (code 2), 1.25 → 1 (code 2), 1.75 → 2 (code 4),
  // 2.5 → 2 (code 4), 3.5 → 4 (code 6), 5 → 4 (code 6). Above 6 saturates to code 7.
  uint8_t code;
  if (a <= 0.25f) code = 0;
  else if (a < 0.75f) code = 1;
  else if (a <= 1.25f) code = 2;
  else if (a < 1.75f) code = 3;
  else if (a <= 2.5f) code = 4;
  else if (a < 3.5f) code = 5;
  else if (a <= 5.0f) code = 6;
  else code = 7;
  return sign | code;
}

float e2m1_decode(uint8_t code) {
  const float m = kE2M1Values[code & 0x7];
  return (code & 0x8) ? -m : m;
}

uint8_t e4m3_encode(float x) {
  if (std::isnan(x)) return 0;  // NaN → +0: the encoder never emits 0x7f / 0xff
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (!(a < kE4M3Max)) return sign | kE4M3MaxCode;  // ≥ 448 and ±inf saturate
  uint32_t code;
  if (a < std::ldexp(1.0f, kE4M3MinNormalExp)) {
    // Subnormal range: value = m · 2^-9, m in [0, 8]; m == 8 is exactly the smallest normal (code 8).
    code = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 9)));
  } else {
    const int e = std::ilogb(a);                                           // a in [2^e, 2^(e+1))
    const float q = std::nearbyint(std::ldexp(a, 3 - e));                  // [8, 16], exact scaling
    code = static_cast<uint32_t>((e + kE4M3Bias - 1) * 8 + static_cast<int>(q));  // (e+7)·8 + (q−8)
  }
  if (code > kE4M3MaxCode) code = kE4M3MaxCode;  // 448 < a < 464 rounds to 448 anyway; be safe
  return sign | static_cast<uint8_t>(code);
}

float e4m3_decode(uint8_t code) {
  const int exp_bits = (code >> 3) & 0xf;
  const int mant = code & 0x7;
  float m;
  if (exp_bits == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exp_bits == 0) m = std::ldexp(static_cast<float>(mant), 1 - kE4M3Bias - 3);  // mant · 2^-9
  else m = std::ldexp(static_cast<float>(8 + mant), exp_bits - kE4M3Bias - 3);
  return (code & 0x80) ? -m : m;
}

uint8_t ue4m3_encode(float x) {
  if (std::isnan(x) || !(x > 0.0f)) return 0;  // negative, −0 and NaN → code 0 (value +0)
  return e4m3_encode(x);
}

}  // namespace moesq::format
