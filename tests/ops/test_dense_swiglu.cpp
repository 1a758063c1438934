// CPU tests of ops::dense_swiglu_ref (the dense-MLP SwiGLU twin; GPU kernel compared in
// tests/gpu/test_engine_ops.cu) against the plain definition in fp64 on fresh random rows: silu(g)·u,
// times σ(z) when gated, as bf16 hi + lo; row strides with padding; the refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/dense_swiglu/dense_swiglu.h"

namespace {

using namespace moesq;

// hi + lo bf16 keeps ≈ 16 significant bits (≤ 2^-17 relative of the fp32 value); the fp32 exp,
// divide and products add a few 2^-24: 2e-5 relative.
constexpr double kRelTol = 2e-5;

TEST(DenseSwigluRef, MatchesThePlainDefinition) {
  for (bool gated : {false, true}) {
    const int64_t T = 9, I = 40, ld = 2 * I + (gated ? 1 : 0) + 3;  // 3 padding columns
    std::mt19937_64 g(gated ? 12 : 11);
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> gu(T * ld);
    for (auto& x : gu) x = d(g);
    std::vector<uint16_t> a(T * I), lo(T * I);
    ops::DenseSwigluArgs args;
    args.gu = gu.data(), args.a = a.data(), args.a_lo = lo.data(), args.T = T, args.I = I, args.ld = ld;
    args.gated = gated;
    ops::dense_swiglu_ref(args);
    for (int64_t t = 0; t < T; ++t) {
      const double s = gated ? 1.0 / (1.0 + std::exp(-static_cast<double>(gu[t * ld + 2 * I]))) : 1.0;
      for (int64_t i = 0; i < I; ++i) {
        const double gg = gu[t * ld + i], u = gu[t * ld + I + i];
        const double want = gg / (1.0 + std::exp(-gg)) * u * s;
        const double got = static_cast<double>(bf16_to_f32(a[t * I + i])) + bf16_to_f32(lo[t * I + i]);
        ASSERT_NEAR(got, want, kRelTol * (std::fabs(want) + 1e-3)) << "gated=" << gated << " t=" << t << " i=" << i;
      }
    }
  }
}

TEST(DenseSwigluRef, Refusals) {
  std::vector<float> gu(10);
  std::vector<uint16_t> a(4);
  ops::DenseSwigluArgs args;
  args.gu = gu.data(), args.a = a.data(), args.T = 1, args.I = 4, args.ld = 8, args.gated = true;
  EXPECT_THROW(ops::dense_swiglu_ref(args), Error);  // no column for the gate logit
  args.ld = 9;
  EXPECT_NO_THROW(ops::dense_swiglu_ref(args));
  args.I = 0;
  EXPECT_THROW(ops::dense_swiglu_ref(args), Error);
}

}  // namespace
