// The GPU router's CPU twin (ops::router_topk_ref) against the model's router (model::select_routes,
// the parity-tested CPU forward) on fresh random logits: softmax routers (Qwen, Mixtral, OLMoE) and
// sigmoid routers with a correction bias, grouped top-k and a routed scaling factor (DeepSeek-V3:
// 256 experts in 8 groups, 4 kept; Kimi-K2.5: 384 experts, one group, × 2.827). Ids equal; weights
// bitwise (the twin runs select_routes' fp32 operations in its order; the softmax sum is the
// kernel's lane butterfly, so there a named tolerance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "model/router.h"
#include "ops/router_topk/router_topk.h"

namespace {

using namespace moesq;

// Softmax weights: the twin's sum is a 32-lane butterfly, select_routes' a left-to-right sum (a few
// fp32 roundings apart on O(1) values).
constexpr double kSoftmaxWeightRelTol = 1e-5;

struct Case {
  io::RouterScoring scoring;
  int E, k, n_group, topk_group;
  bool bias, norm;
  double scale;
};

TEST(RouterTwin, EqualsTheModelsRouter) {
  const std::vector<Case> cases = {
      {io::RouterScoring::Sigmoid, 256, 8, 8, 4, true, true, 2.5},      // DeepSeek-V3
      {io::RouterScoring::Sigmoid, 384, 8, 1, 1, true, true, 2.827},    // Kimi-K2.5
      {io::RouterScoring::Sigmoid, 64, 6, 8, 3, false, false, 1.0},
      {io::RouterScoring::Sigmoid, 16, 4, 4, 2, true, true, 1.0},       // the tiny DeepSeek-V3 fixture's shape
      {io::RouterScoring::Sigmoid, 32, 2, 32, 2, true, true, 1.0},      // one expert per group
      {io::RouterScoring::Softmax, 128, 8, 1, 1, false, true, 1.0},     // Qwen3-MoE
      {io::RouterScoring::Softmax, 64, 8, 1, 1, false, false, 1.0},     // OLMoE
  };
  uint64_t seed = 70;
  for (const Case& c : cases) {
    const int64_t T = 41;
    std::mt19937_64 g(++seed);
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::vector<float> z(T * c.E), bias(c.E);
    for (auto& x : z) x = d(g);
    for (auto& x : bias) x = 0.1f * d(g);
    model::RouterSpec rs;
    rs.num_experts = c.E, rs.top_k = c.k, rs.scoring = c.scoring, rs.correction_bias = c.bias;
    rs.n_group = c.n_group, rs.topk_group = c.topk_group, rs.norm_topk_prob = c.norm, rs.routed_scaling_factor = c.scale;
    const model::Routes want = model::select_routes(rs, z, T, bias.data());
    std::vector<int32_t> ids(T * c.k, -1);
    std::vector<float> w(T * c.k);
    ops::RouterTopkArgs a;
    a.logits = z.data(), a.topk_ids = ids.data(), a.topk_w = w.data(), a.T = T, a.num_experts = c.E, a.topk = c.k;
    a.norm_topk_prob = c.norm, a.sigmoid = c.scoring == io::RouterScoring::Sigmoid;
    a.correction_bias = c.bias ? bias.data() : nullptr, a.n_group = c.n_group, a.topk_group = c.topk_group;
    a.routed_scaling_factor = static_cast<float>(c.scale);
    ops::router_topk_ref(a);
    for (int64_t i = 0; i < T * c.k; ++i) {
      ASSERT_EQ(ids[i], want.expert[i]) << "E=" << c.E << " G=" << c.n_group << " token " << i / c.k << " rank " << i % c.k;
      if (a.sigmoid) {
        ASSERT_EQ(w[i], want.weight[i]) << "E=" << c.E << " token " << i / c.k << " rank " << i % c.k;
      } else {
        ASSERT_NEAR(w[i], want.weight[i], kSoftmaxWeightRelTol * want.weight[i]) << "E=" << c.E << " index " << i;
      }
    }
    if (c.E / c.n_group > 1 && c.topk_group < c.n_group) {  // the grouping changes some token's routes
      model::RouterSpec flat = rs;
      flat.n_group = flat.topk_group = 1;
      EXPECT_NE(model::select_routes(flat, z, T, bias.data()).expert, want.expert) << "E=" << c.E << " G=" << c.n_group;
    }
  }
}

// gpt-oss's router (top-k of z + b, then softmax over the k): the twin's ids equal select_routes's on
// the biased logits (the CPU forward adds the bias before it, DecoderModel::route), its weights bitwise
// (the same fp32 operations: exp(z_j − z_first), a sum in top-k order, one division); norm_topk_prob
// and the scaling factor apply to this scoring in neither.
TEST(RouterTwin, TopkSoftmaxWithLogitBiasEqualsTheModelsRouter) {
  uint64_t seed = 700;
  for (int E : {8, 32, 128}) {
    for (int k : {1, 2, 4}) {
      const int64_t T = 23;
      std::mt19937_64 g(++seed);
      std::normal_distribution<float> d(0.0f, 2.0f);
      std::vector<float> z(T * E), bias(E), zb(T * E);
      for (auto& x : z) x = d(g);
      for (auto& x : bias) x = 0.2f * d(g);
      for (int64_t i = 0; i < T * E; ++i) zb[i] = z[i] + bias[i % E];
      model::RouterSpec rs;
      rs.num_experts = E, rs.top_k = k, rs.scoring = io::RouterScoring::TopkSoftmax;
      rs.norm_topk_prob = false, rs.routed_scaling_factor = 2.0;
      const model::Routes want = model::select_routes(rs, zb, T, nullptr);
      std::vector<int32_t> ids(T * k, -1);
      std::vector<float> w(T * k);
      ops::RouterTopkArgs a;
      a.logits = z.data(), a.topk_ids = ids.data(), a.topk_w = w.data(), a.T = T, a.num_experts = E, a.topk = k;
      a.topk_softmax = true, a.logit_bias = bias.data(), a.norm_topk_prob = false, a.routed_scaling_factor = 2.0f;
      ops::router_topk_ref(a);
      for (int64_t i = 0; i < T * k; ++i) {
        ASSERT_EQ(ids[i], want.expert[i]) << "E=" << E << " k=" << k << " token " << i / k << " rank " << i % k;
        ASSERT_EQ(w[i], want.weight[i]) << "E=" << E << " k=" << k << " token " << i / k << " rank " << i % k;
      }
    }
  }
}

TEST(RouterTwin, RefusesWhatItDoesNotRun) {
  std::vector<float> z(64, 0.0f), w(4);
  std::vector<int32_t> ids(4);
  ops::RouterTopkArgs a;
  a.logits = z.data(), a.topk_ids = ids.data(), a.topk_w = w.data(), a.T = 1, a.num_experts = 64, a.topk = 4;
  a.n_group = 8, a.topk_group = 2;
  EXPECT_THROW(ops::router_topk_ref(a), Error);  // grouped top-k on a softmax router
  a.sigmoid = true, a.n_group = 48;
  EXPECT_THROW(ops::router_topk_ref(a), Error);  // 48 groups: more than 32, and not dividing 64
  a.n_group = 16, a.topk_group = 1, a.topk = 5;
  EXPECT_THROW(ops::router_topk_ref(a), Error);  // k = 5 > the 4 experts of the one kept group
  a.topk = 4;
  EXPECT_NO_THROW(ops::router_topk_ref(a));
  a.n_group = a.topk_group = 1, a.topk_softmax = true;
  EXPECT_THROW(ops::router_topk_ref(a), Error);  // sigmoid and top-k-then-softmax at once
}

}  // namespace
