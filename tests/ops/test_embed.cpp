// CPU tests of ops::embed_ref and ops::gather_rows_ref (the twins the GPU kernels are compared against
// bitwise, tests/gpu/test_embed_argmax.cu) against the plain definitions: out[t] = fp32(table[ids[t]]),
// out[i] = in[rows[i]], on fresh random bf16 rows, repeated and out-of-order indices, awkward widths.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/half.h"
#include "ops/embed/embed.h"

namespace {

using moesq::bf16_to_f32;
using moesq::f32_to_bf16;

std::vector<uint16_t> rand_rows(int64_t n, int64_t H, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> v(n * H);
  for (auto& x : v) x = f32_to_bf16(d(g));
  return v;
}

TEST(OpsEmbed, GathersTheTokensRowsExactly) {
  for (int64_t H : {1, 7, 256, 257}) {
    const int64_t V = 11;
    const std::vector<uint16_t> table = rand_rows(V, H, 100 + H);
    const std::vector<int32_t> ids = {3, 0, 10, 3, 7};  // repeated, first and last rows
    std::vector<float> out(ids.size() * H, -1.0f);
    moesq::ops::EmbedArgs a;
    a.ids = ids.data(), a.table = table.data(), a.out = out.data(), a.T = static_cast<int64_t>(ids.size()), a.H = H;
    moesq::ops::embed_ref(a);
    int64_t nonzero = 0;
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t c = 0; c < H; ++c) {
        const float want = bf16_to_f32(table[ids[t] * H + c]);
        ASSERT_EQ(out[t * H + c], want) << "H=" << H << " t=" << t << " c=" << c;
        nonzero += want != 0.0f;
      }
    EXPECT_GT(nonzero, 0) << "H=" << H;
  }
}

TEST(OpsEmbed, EmptyBatchWritesNothing) {
  const std::vector<uint16_t> table = rand_rows(2, 4, 1);
  float sentinel = 5.0f;
  moesq::ops::EmbedArgs a;
  a.table = table.data(), a.out = &sentinel, a.T = 0, a.H = 4;
  moesq::ops::embed_ref(a);
  EXPECT_EQ(sentinel, 5.0f);
}

TEST(OpsGatherRows, CopiesTheChosenRowsBitForBit) {
  for (int64_t H : {1, 3, 255, 512}) {
    const int64_t n_in = 9;
    const std::vector<uint16_t> in = rand_rows(n_in, H, 200 + H);
    const std::vector<int32_t> rows = {8, 2, 2, 0};
    std::vector<uint16_t> out(rows.size() * H, 0xffff);
    moesq::ops::GatherRowsArgs a;
    a.in = in.data(), a.rows = rows.data(), a.out = out.data(), a.n = static_cast<int64_t>(rows.size()), a.H = H;
    moesq::ops::gather_rows_ref(a);
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t c = 0; c < H; ++c)
        ASSERT_EQ(out[i * H + c], in[rows[i] * H + c]) << "H=" << H << " i=" << i << " c=" << c;
  }
}

}  // namespace
