// CPU tests of ops::scatter_add_f32_ref (the GPU kernel's twin, compared bitwise in
// tests/gpu/test_layer_cuda.cu) against the plain definition y[idx[i], :] += w[i]·src[i, :]: bitwise
// (one product and one sum per element), rows not named untouched, the experts of a MoE combine applied
// in ascending order reproduce a per-token loop in that order, an empty batch, and the argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "ops/scatter_add_f32/scatter_add_f32.h"
#include "support/expect_error.h"

namespace {

using moesq::ops::ScatterAddF32Args;

std::vector<float> random_vec(size_t n, uint64_t seed, float sd = 2.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(g);
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(ScatterAddF32, MatchesPlainDefinitionBitwise) {
  for (const int64_t C : {1, 7, 257, 2048}) {
    const int64_t y_rows = 40, m = 17;
    std::vector<int64_t> rows(y_rows);
    std::iota(rows.begin(), rows.end(), 0);
    std::shuffle(rows.begin(), rows.end(), std::mt19937_64(C));
    const std::vector<int64_t> idx(rows.begin(), rows.begin() + m);
    const auto src = random_vec(m * C, 10 + C), w = random_vec(m, 20 + C, 0.5f);
    std::vector<float> y = random_vec(y_rows * C, 30 + C);
    std::vector<float> want = y;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < C; ++c) {
        const float p = w[i] * src[i * C + c];
        want[idx[i] * C + c] += p;
      }
    moesq::ops::scatter_add_f32_ref(
        {.src = src.data(), .w = w.data(), .idx = idx.data(), .m = m, .C = C, .y = y.data(), .y_rows = y_rows});
    EXPECT_TRUE(same_bits(y, want)) << "C=" << C;
    // The rows no index names keep their bits.
    const auto before = random_vec(y_rows * C, 30 + C);
    int64_t untouched = 0;
    for (int64_t r = 0; r < y_rows; ++r)
      if (std::find(idx.begin(), idx.end(), r) == idx.end()) {
        EXPECT_EQ(0, std::memcmp(&y[r * C], &before[r * C], C * sizeof(float))) << "row " << r;
        ++untouched;
      }
    EXPECT_EQ(untouched, y_rows - m);
  }
}

// Top-k routes of n tokens over E experts: scattering each expert's outputs in ascending expert order
// equals the per-token loop of DecoderModel::moe_block (experts of a token in ascending id order).
TEST(ScatterAddF32, AscendingExpertsReproduceThePerTokenCombine) {
  const int64_t n = 50, E = 9, k = 3, C = 33;
  std::mt19937_64 g(5);
  std::vector<int32_t> expert(n * k);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> ids(E);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), g);
    std::copy_n(ids.begin(), k, expert.begin() + t * k);
  }
  const auto weight = random_vec(n * k, 6, 0.3f);
  const auto out = random_vec(n * k * C, 7);  // [n·k, C] each route's expert output
  std::vector<float> want(n * C, 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int64_t> slot(k);
    std::iota(slot.begin(), slot.end(), 0);
    std::sort(slot.begin(), slot.end(), [&](int64_t a, int64_t b) { return expert[t * k + a] < expert[t * k + b]; });
    for (int64_t j : slot)
      for (int64_t c = 0; c < C; ++c) want[t * C + c] += out[(t * k + j) * C + c] * weight[t * k + j];
  }
  std::vector<float> y(n * C, 0.0f);
  for (int32_t e = 0; e < E; ++e) {
    std::vector<int64_t> idx;
    std::vector<float> w, src;
    for (int64_t i = 0; i < n * k; ++i)
      if (expert[i] == e) {
        idx.push_back(i / k);
        w.push_back(weight[i]);
        src.insert(src.end(), out.begin() + i * C, out.begin() + (i + 1) * C);
      }
    moesq::ops::scatter_add_f32_ref({.src = src.data(), .w = w.data(), .idx = idx.data(),
                                     .m = static_cast<int64_t>(idx.size()), .C = C, .y = y.data(), .y_rows = n});
  }
  EXPECT_TRUE(same_bits(y, want));
}

TEST(ScatterAddF32, ArgumentErrorsNameTheProblem) {
  const auto src = random_vec(2 * 4, 1), w = random_vec(2, 2);
  std::vector<float> y(3 * 4);
  EXPECT_NO_THROW(moesq::ops::scatter_add_f32_ref({.src = nullptr, .w = nullptr, .idx = nullptr, .m = 0, .C = 4,
                                                   .y = nullptr, .y_rows = 0}));
  std::vector<int64_t> idx = {0, 3};
  ScatterAddF32Args a{.src = src.data(), .w = w.data(), .idx = idx.data(), .m = 2, .C = 4, .y = y.data(), .y_rows = 3};
  EXPECT_ERROR_CONTAINING(moesq::ops::scatter_add_f32_ref(a), "index 3 of row 1 is outside the 3 output rows");
  idx = {2, 2};
  EXPECT_ERROR_CONTAINING(moesq::ops::scatter_add_f32_ref(a), "output row 2 repeated (row 1)");
  idx = {-1, 0};
  EXPECT_ERROR_CONTAINING(moesq::ops::scatter_add_f32_ref(a), "index -1 of row 0");
  ScatterAddF32Args b = a;
  b.C = 0;
  EXPECT_ERROR_CONTAINING(moesq::ops::scatter_add_f32_check(b), "bad shape m=2 C=0 y_rows=3");
  b = a;
  b.w = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::scatter_add_f32_check(b), "null pointer");
  b = a;
  b.y = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::scatter_add_f32_check(b), "null pointer");
}
