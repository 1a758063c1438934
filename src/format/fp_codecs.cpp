// E2M1 / E4M3 / UE4M3 scalar codecs (fp_codecs.h): round to nearest, ties to even code, saturating.
//
// Non-obvious decision: E4M3 encoding rounds the fp32 bit pattern directly (add 0x7ffff + the lowest
// kept bit, shift by 20): one integer rounding, ties to even mantissa, which is "ties to even code"
// because the code is exponent·8 + mantissa; a carry out of the mantissa lands on the next
// exponent's code by the same arithmetic. No libm calls: it runs once per scale block on hot paths.
// Unlike ml_dtypes (overflow → NaN), values beyond 448 saturate to 448: a block scale must never be NaN.
#include "format/fp_codecs.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace moesq::format {

namespace {

constexpr uint8_t kE4M3MaxCode = 0x7e;  // 448 = 2^8 · 1.75: exponent 15, mantissa 6 (0x7f is NaN)
constexpr uint32_t kE4M3Bias = 7;
constexpr float kE4M3MinNormal = 0x1p-6f;  // smallest normal; subnormal step 2^-9

}  // namespace

void throw_e2m1_nan() {
  MOESQ_FAIL("E2M1 encoder: NaN input (a NaN weight or activation reached the quantizer unchecked)");
}

uint8_t e4m3_encode(float x) {
  if (std::isnan(x)) return 0;  // NaN → +0: the encoder never emits 0x7f / 0xff
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (!(a < kE4M3Max)) return sign | kE4M3MaxCode;  // ≥ 448 and ±inf saturate
  uint32_t code;
  if (a < kE4M3MinNormal) {
    // Subnormal range: value = m · 2^-9, m in [0, 8]; m == 8 is exactly the smallest normal (code 8).
    // a·512 is exact; adding and subtracting 2^23 rounds it to an integer, ties to even.
    code = static_cast<uint32_t>((a * 512.0f + 0x1p23f) - 0x1p23f);
  } else {
    // Normal range: round the fp32 mantissa to 3 bits, ties to even (as f32_to_bf16 does to 7);
    // the top 12 bits are then exponent·8 + mantissa with fp32's bias 127 instead of 7.
    uint32_t u;
    std::memcpy(&u, &a, 4);
    u += 0x7ffffu + ((u >> 20) & 1u);
    code = (u >> 20) - ((127u - kE4M3Bias) << 3);
  }
  if (code > kE4M3MaxCode) code = kE4M3MaxCode;  // a < 448 never rounds past 448; be safe
  return sign | static_cast<uint8_t>(code);
}

namespace {
float e4m3_decode_slow(uint8_t code) {
  const int exp_bits = (code >> 3) & 0xf;
  const int mant = code & 0x7;
  const int bias = static_cast<int>(kE4M3Bias);
  if (exp_bits == 0xf && mant == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float m = exp_bits == 0 ? std::ldexp(static_cast<float>(mant), 1 - bias - 3)       // mant · 2^-9
                                : std::ldexp(static_cast<float>(8 + mant), exp_bits - bias - 3);
  return (code & 0x80) ? -m : m;
}
}  // namespace

float e4m3_decode(uint8_t code) {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = e4m3_decode_slow(static_cast<uint8_t>(c));
    return t;
  }();
  return table[code];
}

uint8_t ue4m3_encode(float x) {
  if (std::isnan(x) || !(x > 0.0f)) return 0;  // negative, −0 and NaN → code 0 (value +0)
  return e4m3_encode(x);
}

}  // namespace moesq::format
