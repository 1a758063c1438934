// CPU tests of ops::split_tf32_ref (the GPU kernel's twin, compared bitwise in
// tests/gpu/test_layer_cuda.cu): hi is x rounded to nearest even at TF32's 10-bit mantissa (against a
// plain definition in double), hi and lo are TF32-exact, hi + lo is x to 2⁻²² (normal x; 2⁻¹³⁷ absolute
// for subnormals), ties go to even,
// infinities / NaNs pass through hi with lo = 0, a product of TF32-exact values is exact in fp32 (why
// 3xTF32 GEMMs are fp32-accurate), and the argument errors.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ops/split_tf32/split_tf32.h"
#include "support/expect_error.h"

namespace {

using moesq::ops::split_tf32_ref;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
bool tf32_exact(float x) { return (bits(x) & 0x1fffu) == 0; }

// Round-to-nearest-even to 11 significant bits, in double (normal fp32 range).
float plain_tf32(float x) {
  if (x == 0.0f) return x;
  int e = 0;
  const double m = std::frexp(static_cast<double>(x), &e);  // x = m·2^e, 0.5 ≤ |m| < 1
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, 11)), e - 11));
}

// The relative error bound of hi + lo (2⁻²²).
constexpr double kSplitRelErr = 0x1p-22;

}  // namespace

TEST(SplitTf32, HiIsRoundToNearestEvenAndHiPlusLoIsX) {
  std::mt19937_64 g(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-100, 100);
  const int64_t n = 20000;
  std::vector<float> x(n), hi(n), lo(n);
  for (auto& v : x) v = std::ldexp(nd(g), ex(g));
  split_tf32_ref({.x = x.data(), .n = n, .hi = hi.data(), .lo = lo.data()});
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits(hi[i]), bits(plain_tf32(x[i]))) << "x = " << x[i];
    ASSERT_TRUE(tf32_exact(hi[i]) && tf32_exact(lo[i])) << "x = " << x[i];
    const double err = std::fabs(static_cast<double>(x[i]) - (static_cast<double>(hi[i]) + lo[i]));
    ASSERT_LE(err, kSplitRelErr * std::fabs(static_cast<double>(x[i]))) << "x = " << x[i];
  }
}

TEST(SplitTf32, TiesGoToEven) {
  // 1 + 2⁻¹¹ lies halfway between 1 and 1 + 2⁻¹⁰: even (1). 1 + 3·2⁻¹¹: halfway, even is 1 + 2⁻⁹.
  const std::vector<float> x = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -(1.0f + 0x1p-11f)};
  std::vector<float> hi(3), lo(3);
  split_tf32_ref({.x = x.data(), .n = 3, .hi = hi.data(), .lo = lo.data()});
  EXPECT_EQ(hi[0], 1.0f);
  EXPECT_EQ(lo[0], 0x1p-11f);
  EXPECT_EQ(hi[1], 1.0f + 0x1p-9f);
  EXPECT_EQ(lo[1], -0x1p-11f);
  EXPECT_EQ(hi[2], -1.0f);
}

TEST(SplitTf32, NonFiniteValuesPassThroughHi) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), FLT_MAX, 0.0f, -0.0f,
                                std::numeric_limits<float>::denorm_min() * 12345};
  std::vector<float> hi(x.size()), lo(x.size());
  split_tf32_ref({.x = x.data(), .n = static_cast<int64_t>(x.size()), .hi = hi.data(), .lo = lo.data()});
  EXPECT_EQ(hi[0], inf);
  EXPECT_EQ(hi[1], -inf);
  EXPECT_TRUE(std::isnan(hi[2]));
  EXPECT_EQ(hi[3], inf);  // FLT_MAX rounds past the largest TF32 value
  for (int i = 0; i < 4; ++i) EXPECT_EQ(lo[i], 0.0f) << i;
  EXPECT_EQ(bits(hi[4]), bits(0.0f));
  EXPECT_EQ(bits(hi[5]), bits(-0.0f));
  // A subnormal keeps TF32's absolute step there: |x − hi − lo| ≤ 2⁻¹³⁷ (the low 13 bits of its encoding).
  EXPECT_LE(std::fabs(static_cast<double>(x[6]) - (static_cast<double>(hi[6]) + lo[6])), 0x1p-137);
}

TEST(SplitTf32, ProductsOfTf32PartsAreExactInFp32) {
  std::mt19937_64 g(8);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int i = 0; i < 5000; ++i) {
    float a[1] = {nd(g)}, b[1] = {nd(g)}, ah, al, bh, bl;
    split_tf32_ref({.x = a, .n = 1, .hi = &ah, .lo = &al});
    split_tf32_ref({.x = b, .n = 1, .hi = &bh, .lo = &bl});
    for (const auto& [p, q] : {std::pair{ah, bh}, std::pair{ah, bl}, std::pair{al, bh}})
      ASSERT_EQ(static_cast<double>(p * q), static_cast<double>(p) * q) << p << " · " << q;
  }
}

TEST(SplitTf32, ArgumentErrors) {
  float v = 1.0f;
  EXPECT_ERROR_CONTAINING(split_tf32_ref({.x = &v, .n = -1, .hi = &v, .lo = &v}), "n = -1");
  EXPECT_ERROR_CONTAINING(split_tf32_ref({.x = nullptr, .n = 1, .hi = &v, .lo = &v}), "null pointer");
  split_tf32_ref({.x = nullptr, .n = 0, .hi = nullptr, .lo = nullptr});  // empty: nothing to do
}
