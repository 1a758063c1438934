// CPU tests of ops::argmax_ref (the twin the GPU kernel is compared against exactly,
// tests/gpu/test_embed_argmax.cu) against the plain definition: the index of the maximum, the lowest
// index among tied maxima, -inf and NaN never chosen over a finite value, 0 for a row with nothing
// above -inf.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/argmax/argmax.h"

namespace {

int32_t plain_argmax(const float* z, int64_t V) {
  int32_t best = -1;
  for (int64_t v = 0; v < V; ++v) {
    if (std::isnan(z[v]) || z[v] == -INFINITY) continue;
    if (best < 0 || z[v] > z[best]) best = static_cast<int32_t>(v);  // strict: ties keep the lower id
  }
  return best < 0 ? 0 : best;
}

std::vector<int32_t> run(const std::vector<float>& logits, int64_t n, int64_t V) {
  std::vector<int32_t> out(n, -7);
  moesq::ops::ArgmaxArgs a;
  a.logits = logits.data(), a.out = out.data(), a.n = n, a.V = V;
  moesq::ops::argmax_ref(a);
  return out;
}

TEST(OpsArgmax, RandomRowsMatchThePlainDefinition) {
  std::mt19937_64 g(42);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (int64_t V : {1, 2, 255, 256, 257, 1000}) {
    const int64_t n = 5;
    std::vector<float> z(n * V);
    for (auto& x : z) x = d(g);
    const std::vector<int32_t> got = run(z, n, V);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], plain_argmax(&z[i * V], V)) << "V=" << V << " row " << i;
  }
}

TEST(OpsArgmax, TiesGiveTheLowestId) {
  const int64_t V = 600;
  std::vector<float> z(V, 0.5f);
  z[17] = z[300] = z[599] = 2.0f;  // three tied maxima, far apart (different threads of the kernel)
  EXPECT_EQ(run(z, 1, V)[0], 17);
  std::vector<float> flat(V, 1.25f);  // every value tied
  EXPECT_EQ(run(flat, 1, V)[0], 0);
}

TEST(OpsArgmax, InfinitiesAndNaN) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> z = {nan, -inf, -3.0f, nan,  // row 0: -3 at 2
                                -inf, -inf, -inf, -inf,  // row 1: nothing above -inf → 0
                                1.0f, inf, nan, inf,     // row 2: +inf, lowest id 1
                                nan, nan, nan, nan};     // row 3: all NaN → 0
  const std::vector<int32_t> got = run(z, 4, 4);
  EXPECT_EQ(got, (std::vector<int32_t>{2, 0, 1, 0}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], plain_argmax(&z[i * 4], 4)) << "row " << i;
}

}  // namespace
