// CPU tests of ops::gather_f32_ref (the GPU kernel's twin, compared bitwise in tests/gpu/test_refine_ops.cu)
// against the plain definition out[i, :] = src[idx[i], :] (zeros for idx[i] < 0): bitwise (a copy),
// every output row written, awkward widths, an empty batch, an empty source, and the argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "ops/gather_f32/gather_f32.h"
#include "support/expect_error.h"

namespace {

using moesq::ops::GatherF32Args;

constexpr float kPoison = std::numeric_limits<float>::quiet_NaN();  // any row left unwritten stays NaN

std::vector<float> random_matrix(int64_t rows, int64_t C, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(rows * C);
  for (auto& v : x) v = nd(g);
  return x;
}

// m indices into [0, src_rows) with repeats, every third one a padding row (−1 or −7).
std::vector<int64_t> random_idx(int64_t m, int64_t src_rows, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int64_t> idx(m);
  for (int64_t i = 0; i < m; ++i)
    idx[i] = (i % 3 == 2 || src_rows == 0) ? -1 - static_cast<int64_t>(g() % 7) : static_cast<int64_t>(g() % src_rows);
  return idx;
}

// The plain definition.
std::vector<float> plain_gather(const std::vector<float>& src, int64_t C, const std::vector<int64_t>& idx) {
  std::vector<float> out(idx.size() * C);
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t c = 0; c < C; ++c) out[i * C + c] = idx[i] < 0 ? 0.0f : src[idx[i] * C + c];
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(GatherF32, MatchesPlainDefinitionBitwise) {
  for (const int64_t C : {1, 7, 64, 255, 257, 2048})
    for (const int64_t m : {1, 3, 33, 100}) {
      const int64_t src_rows = 19;
      const auto src = random_matrix(src_rows, C, 100 + C);
      const auto idx = random_idx(m, src_rows, 200 + m);
      std::vector<float> out(m * C, kPoison);
      moesq::ops::gather_f32_ref({.src = src.data(), .src_rows = src_rows, .C = C, .idx = idx.data(), .m = m,
                                   .out = out.data()});
      const auto want = plain_gather(src, C, idx);
      ASSERT_TRUE(same_bits(out, want)) << "C=" << C << " m=" << m;
      int64_t nonzero = 0;
      for (float v : out) nonzero += v != 0.0f;
      EXPECT_GT(nonzero, 0) << "C=" << C << " m=" << m;
    }
}

TEST(GatherF32, PaddingRowsAreZeroAndEmptyCasesWork) {
  const int64_t C = 40;
  const auto src = random_matrix(5, C, 3);
  const std::vector<int64_t> idx = {-1, 4, -100, 0};
  std::vector<float> out(idx.size() * C, kPoison);
  moesq::ops::gather_f32_ref({.src = src.data(), .src_rows = 5, .C = C, .idx = idx.data(), .m = 4, .out = out.data()});
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(out[0 * C + c], 0.0f);
    EXPECT_EQ(out[1 * C + c], src[4 * C + c]);
    EXPECT_EQ(out[2 * C + c], 0.0f);
    EXPECT_EQ(out[3 * C + c], src[0 * C + c]);
  }
  // An empty batch needs no buffers; an empty source can still produce padding rows.
  EXPECT_NO_THROW(moesq::ops::gather_f32_ref({.src = nullptr, .src_rows = 0, .C = C, .idx = nullptr, .m = 0,
                                               .out = nullptr}));
  const std::vector<int64_t> pad = {-1, -1};
  std::vector<float> z(2 * C, kPoison);
  float dummy = 0.0f;
  moesq::ops::gather_f32_ref({.src = &dummy, .src_rows = 0, .C = C, .idx = pad.data(), .m = 2, .out = z.data()});
  for (float v : z) EXPECT_EQ(v, 0.0f);
}

TEST(GatherF32, ArgumentErrorsNameTheProblem) {
  const auto src = random_matrix(3, 8, 1);
  std::vector<float> out(2 * 8);
  const std::vector<int64_t> idx = {0, 3};  // 3 is past the 3 source rows
  GatherF32Args a{.src = src.data(), .src_rows = 3, .C = 8, .idx = idx.data(), .m = 2, .out = out.data()};
  EXPECT_ERROR_CONTAINING(moesq::ops::gather_f32_ref(a), "index 3 of row 1 is past the 3 source rows");
  GatherF32Args b = a;
  b.C = 0;
  EXPECT_ERROR_CONTAINING(moesq::ops::gather_f32_check(b), "bad shape src_rows=3 C=0 m=2");
  b = a;
  b.m = -1;
  EXPECT_ERROR_CONTAINING(moesq::ops::gather_f32_check(b), "m=-1");
  b = a;
  b.src_rows = -2;
  EXPECT_ERROR_CONTAINING(moesq::ops::gather_f32_check(b), "src_rows=-2");
  b = a;
  b.src = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::gather_f32_check(b), "null pointer");
  b = a;
  b.idx = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::gather_f32_check(b), "null pointer");
  b = a;
  b.out = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::gather_f32_check(b), "null pointer");
}
