// GPU tests of ops::embed, ops::gather_rows and ops::argmax against their CPU twins on fresh random
// inputs with fixed seeds: every one is exact (copies and comparisons), so the checks are BITWISE.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cuda/dev_buf.cuh"
#include "core/half.h"
#include "ops/argmax/argmax.h"
#include "ops/embed/embed.h"
#include "support/gpu_test_main.h"

using moesq::DevBuf;

namespace {

std::vector<uint16_t> rand_bf16(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = moesq::f32_to_bf16(d(g));
  return v;
}
std::vector<int32_t> rand_ids(size_t n, int32_t hi, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int32_t> d(0, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(GpuEmbed, MatchesTwinBitwise) {
  for (int64_t H : {1, 100, 256, 2049}) {
    for (int64_t T : {1, 2, 3, 255, 257}) {
      const int32_t V = 37;
      const std::vector<uint16_t> table = rand_bf16(V * H, 7 * H + T);
      const std::vector<int32_t> ids = rand_ids(T, V, 11 * T + H);
      std::vector<float> want(T * H);
      moesq::ops::EmbedArgs a;
      a.ids = ids.data(), a.table = table.data(), a.out = want.data(), a.T = T, a.H = H;
      moesq::ops::embed_ref(a);
      DevBuf<uint16_t> d_table(table);
      DevBuf<int32_t> d_ids(ids);
      DevBuf<float> d_out(T * H);
      a.ids = d_ids.p, a.table = d_table.p, a.out = d_out.p;
      moesq::ops::embed(a, nullptr);
      const std::vector<float> got = d_out.download();
      int64_t nonzero = 0;
      for (int64_t i = 0; i < T * H; ++i) {
        ASSERT_EQ(bits(got[i]), bits(want[i])) << "T=" << T << " H=" << H << " first bad index " << i;
        nonzero += got[i] != 0.0f;
      }
      EXPECT_GT(nonzero, 0) << "T=" << T << " H=" << H;
    }
  }
}

TEST(GpuGatherRows, MatchesTwinBitwise) {
  for (int64_t H : {1, 255, 2048}) {
    for (int64_t n : {1, 3, 129}) {
      const int32_t rows_in = 300;
      const std::vector<uint16_t> in = rand_bf16(rows_in * H, 5 * H + n);
      const std::vector<int32_t> rows = rand_ids(n, rows_in, 3 * n + H);
      std::vector<uint16_t> want(n * H);
      moesq::ops::GatherRowsArgs a;
      a.in = in.data(), a.rows = rows.data(), a.out = want.data(), a.n = n, a.H = H;
      moesq::ops::gather_rows_ref(a);
      DevBuf<uint16_t> d_in(in), d_out(n * H);
      DevBuf<int32_t> d_rows(rows);
      a.in = d_in.p, a.rows = d_rows.p, a.out = d_out.p;
      moesq::ops::gather_rows(a, nullptr);
      const std::vector<uint16_t> got = d_out.download();
      for (int64_t i = 0; i < n * H; ++i)
        ASSERT_EQ(got[i], want[i]) << "n=" << n << " H=" << H << " first bad index " << i;
    }
  }
}

// Random rows, plus rows with planted ties (lowest id wins), -inf / NaN entries and a row of -inf.
TEST(GpuArgmax, MatchesTwinExactly) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t V : {1, 2, 255, 256, 257, 151936}) {
    const int64_t n = 6;
    std::mt19937_64 g(V);
    std::normal_distribution<float> d(0.0f, 4.0f);
    std::vector<float> z(n * V);
    for (auto& x : z) x = d(g);
    if (V > 3) {
      float* tie = &z[1 * V];
      tie[V - 1] = tie[V / 2] = tie[1] = 100.0f;  // lowest of the tied ids: 1
      float* odd = &z[2 * V];
      odd[0] = nan, odd[V - 1] = -inf;
      for (int64_t v = 0; v < V; ++v) z[3 * V + v] = -inf;
      for (int64_t v = 0; v < V; ++v) z[4 * V + v] = 0.25f;  // all tied: 0
    }
    std::vector<int32_t> want(n);
    moesq::ops::ArgmaxArgs a;
    a.logits = z.data(), a.out = want.data(), a.n = n, a.V = V;
    moesq::ops::argmax_ref(a);
    DevBuf<float> d_z(z);
    DevBuf<int32_t> d_out(n);
    a.logits = d_z.p, a.out = d_out.p;
    moesq::ops::argmax(a, nullptr);
    const std::vector<int32_t> got = d_out.download();
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(got[i], want[i]) << "V=" << V << " row " << i;
    if (V > 3) EXPECT_EQ(got[1], 1) << "V=" << V;
  }
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
