// The data-driven router (model/router.h) against plain definitions written here: softmax → top-k →
// optional renormalisation (Qwen, Mixtral, OLMoE), and sigmoid + correction bias + grouped top-k +
// renormalisation + routed scaling (DeepSeek-V3's route_tokens_to_experts), on fresh random logits,
// plus one hand-worked grouped case whose answer is exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/router.h"

namespace {

using moesq::model::RouterSpec;
using moesq::model::Routes;
using moesq::model::select_routes;

// fp32 softmax / sigmoid vs the plain double definitions: weights agree to a few ulps.
constexpr double kWeightAtol = 1e-6;

// Plain definition: scores in double, full sort of (score desc, id asc), groups by full sort too.
void plain_route(const RouterSpec& rs, const float* z, const float* bias, std::vector<int32_t>& ids,
                 std::vector<double>& w) {
  const int64_t E = rs.num_experts, K = rs.top_k;
  std::vector<double> p(E), c(E);
  if (rs.scoring == moesq::io::RouterScoring::Softmax) {
    double mx = *std::max_element(z, z + E), sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - mx));
    for (auto& v : p) v /= sum;
    c = p;
  } else {
    for (int64_t e = 0; e < E; ++e) p[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(z[e])));
    for (int64_t e = 0; e < E; ++e) c[e] = p[e] + (bias ? bias[e] : 0.0);
    const int64_t G = rs.n_group, per = E / G;
    std::vector<std::pair<double, int64_t>> gs;
    for (int64_t g = 0; g < G; ++g) {
      std::vector<double> v(c.begin() + g * per, c.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      gs.push_back({-(v[0] + (per > 1 ? v[1] : 0.0)), g});
    }
    std::sort(gs.begin(), gs.end());
    std::vector<bool> keep(G, false);
    for (int64_t i = 0; i < rs.topk_group; ++i) keep[gs[i].second] = true;
    for (int64_t e = 0; e < E; ++e)
      if (!keep[e / per]) c[e] = 0.0;
  }
  std::vector<int32_t> o(E);
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return c[a] > c[b]; });
  ids.assign(o.begin(), o.begin() + K);
  w.clear();
  double s = 0;
  for (int32_t e : ids) s += p[e];
  for (int32_t e : ids) w.push_back((rs.norm_topk_prob ? p[e] / s : p[e]) * rs.routed_scaling_factor);
}

void check_against_plain(const RouterSpec& rs, int64_t n, uint32_t seed, bool with_bias) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(n * rs.num_experts), bias(rs.num_experts);
  for (auto& v : logits) v = nd(rng);
  for (auto& v : bias) v = 0.1f * nd(rng);
  const Routes r = select_routes(rs, logits, n, with_bias ? bias.data() : nullptr);
  ASSERT_EQ(r.expert.size(), static_cast<size_t>(n * rs.top_k));
  EXPECT_EQ(r.logits, logits);
  double wmax = 0;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> ids;
    std::vector<double> w;
    plain_route(rs, &logits[t * rs.num_experts], with_bias ? bias.data() : nullptr, ids, w);
    for (int64_t j = 0; j < rs.top_k; ++j) {
      ASSERT_EQ(r.expert[t * rs.top_k + j], ids[j]) << "row " << t << " slot " << j;
      EXPECT_NEAR(r.weight[t * rs.top_k + j], w[j], kWeightAtol) << "row " << t << " slot " << j;
      wmax = std::max(wmax, std::fabs(w[j]));
    }
  }
  EXPECT_GT(wmax, 0.01) << "weights are (nearly) all zero";
}

TEST(Router, SoftmaxMatchesPlainDefinition) {
  RouterSpec rs;
  rs.num_experts = 16;
  for (int64_t k : {1, 2, 4, 16}) {
    rs.top_k = k;
    for (bool norm : {true, false}) {
      rs.norm_topk_prob = norm;
      check_against_plain(rs, 37, static_cast<uint32_t>(k * 2 + norm), false);
    }
  }
}

TEST(Router, SigmoidGroupedMatchesPlainDefinition) {
  RouterSpec rs;
  rs.scoring = moesq::io::RouterScoring::Sigmoid;
  rs.correction_bias = true;
  rs.num_experts = 32;
  rs.top_k = 4;
  rs.n_group = 8;
  rs.topk_group = 3;
  rs.routed_scaling_factor = 2.5;
  check_against_plain(rs, 41, 7, true);
  rs.norm_topk_prob = false;
  check_against_plain(rs, 41, 8, true);
  rs.n_group = rs.topk_group = 1;  // ungrouped sigmoid
  check_against_plain(rs, 41, 9, true);
}

// Many rows take the chunked, threaded path: every row's experts and weights are the bits the same row
// gets routed alone (one row, the serial path), for each scoring.
TEST(Router, ThreadedRowsEqualRowsRoutedAlone) {
  const int64_t n = 20000;  // > 2 chunks of 4,096 rows
  for (auto scoring : {moesq::io::RouterScoring::Softmax, moesq::io::RouterScoring::Sigmoid,
                       moesq::io::RouterScoring::TopkSoftmax}) {
    RouterSpec rs;
    rs.scoring = scoring;
    rs.num_experts = 64;
    rs.top_k = 6;
    if (scoring == moesq::io::RouterScoring::Sigmoid) {
      rs.correction_bias = true;
      rs.n_group = 8;
      rs.topk_group = 4;
    }
    std::mt19937 rng(11 + static_cast<uint32_t>(scoring));
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<float> logits(n * rs.num_experts), bias(rs.num_experts);
    for (auto& v : logits) v = nd(rng);
    for (auto& v : bias) v = 0.1f * nd(rng);
    const float* b = rs.correction_bias ? bias.data() : nullptr;
    const Routes all = select_routes(rs, logits, n, b);
    for (int64_t t = 0; t < n; t += 97) {
      const std::vector<float> row(logits.begin() + t * rs.num_experts, logits.begin() + (t + 1) * rs.num_experts);
      const Routes one = select_routes(rs, row, 1, b);
      for (int64_t j = 0; j < rs.top_k; ++j) {
        ASSERT_EQ(all.expert[t * rs.top_k + j], one.expert[j]) << "row " << t;
        ASSERT_EQ(all.weight[t * rs.top_k + j], one.weight[j]) << "row " << t;
      }
    }
  }
}

// E = 4 in 2 groups of 2, keep 1 group, k = 1. Group 0 = {0, 1}, group 1 = {2, 3}. Expert 0 has the
// highest single score, but group 1's top-2 sum is larger, so expert 0 is masked out and expert 2 wins.
TEST(Router, GroupMaskingHandWorked) {
  RouterSpec rs;
  rs.scoring = moesq::io::RouterScoring::Sigmoid;
  rs.num_experts = 4;
  rs.top_k = 1;
  rs.n_group = 2;
  rs.topk_group = 1;
  rs.norm_topk_prob = false;
  const std::vector<float> logits = {3.0f, -3.0f, 2.0f, 1.5f};  // σ: .953 .047 | .881 .818
  const Routes r = select_routes(rs, logits, 1, nullptr);
  EXPECT_EQ(r.expert[0], 2);
  EXPECT_FLOAT_EQ(r.weight[0], 1.0f / (1.0f + std::exp(-2.0f)));
}

TEST(Router, BadSpecsAreErrors) {
  RouterSpec rs;
  rs.num_experts = 6;
  rs.top_k = 7;
  EXPECT_THROW(select_routes(rs, std::vector<float>(6), 1, nullptr), moesq::Error);
  rs.top_k = 2;
  rs.n_group = 4;  // 6 experts do not split into 4 groups
  rs.scoring = moesq::io::RouterScoring::Sigmoid;
  EXPECT_THROW(select_routes(rs, std::vector<float>(6), 1, nullptr), moesq::Error);
  rs.n_group = 1;
  rs.correction_bias = true;  // bias required but missing
  EXPECT_THROW(select_routes(rs, std::vector<float>(6), 1, nullptr), moesq::Error);
}

}  // namespace
