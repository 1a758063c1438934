// Both twins evaluate s = 1 / (1 + exp(-z)) and b = s + bias in fp32, as torch does; they differ in
// how they select (partial selection with a group-id filter vs. full sorts over a masked score
// vector), so agreement checks the selection logic, not a shared helper.
#include "model/routers/sigmoid_grouped_topk.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace moesq::model {

namespace {

void check(const GroupedTopkParams& p, const std::vector<float>& bias) {
  MOESQ_CHECK(p.num_experts > 0 && p.n_group > 0 && p.num_experts % p.n_group == 0, "grouped top-k: num_experts ",
              p.num_experts, " is not a positive multiple of n_group ", p.n_group);
  MOESQ_CHECK(p.num_experts / p.n_group >= 2, "grouped top-k: groups of ", p.num_experts / p.n_group,
              " expert(s); the group score needs >= 2");
  MOESQ_CHECK(p.topk_group >= 1 && p.topk_group <= p.n_group, "grouped top-k: topk_group ", p.topk_group,
              " not in [1, n_group = ", p.n_group, "]");
  MOESQ_CHECK(p.top_k >= 1 && p.top_k <= p.topk_group * (p.num_experts / p.n_group), "grouped top-k: top_k ", p.top_k,
              " not in [1, experts of the kept groups = ", p.topk_group * (p.num_experts / p.n_group), "]");
  MOESQ_CHECK(bias.empty() || static_cast<int64_t>(bias.size()) == p.num_experts, "grouped top-k: correction bias has ",
              bias.size(), " values, expected E = ", p.num_experts);
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

Routes make_routes(const GroupedTopkParams& p, const float* logits, int64_t n) {
  Routes r;
  r.n = n;
  r.k = p.top_k;
  r.logits.assign(logits, logits + n * p.num_experts);
  r.expert.resize(n * p.top_k);
  r.weight.resize(n * p.top_k);
  return r;
}

// Weights of the chosen experts of row t from the unbiased scores s.
void set_weights(const GroupedTopkParams& p, const float* s, Routes& r, int64_t t) {
  float sum = 0.0f;
  for (int64_t j = 0; j < p.top_k; ++j) sum += s[r.expert[t * p.top_k + j]];
  const float denom = sum + 1e-20f;
  for (int64_t j = 0; j < p.top_k; ++j) {
    const float w = s[r.expert[t * p.top_k + j]];
    r.weight[t * p.top_k + j] = (p.norm_topk_prob ? w / denom : w) * p.routed_scaling_factor;
  }
}

}  // namespace

Routes sigmoid_grouped_topk(const GroupedTopkParams& p, const float* logits, int64_t n,
                            const std::vector<float>& correction_bias) {
  check(p, correction_bias);
  const int64_t E = p.num_experts, G = p.n_group, per = E / G, K = p.top_k;
  Routes r = make_routes(p, logits, n);
  std::vector<float> s(E), b(E), group_score(G);  // [E], [E], [G]
  std::vector<int32_t> groups(G), cand;
  std::vector<char> kept(G);
  auto higher = [](const std::vector<float>& v) {
    return [&v](int32_t a, int32_t c) { return v[a] > v[c] || (v[a] == v[c] && a < c); };
  };
  for (int64_t t = 0; t < n; ++t) {
    const float* z = logits + t * E;
    for (int64_t e = 0; e < E; ++e) {
      s[e] = sigmoid(z[e]);
      b[e] = s[e] + (correction_bias.empty() ? 0.0f : correction_bias[e]);
    }
    for (int64_t g = 0; g < G; ++g) {  // sum of the two largest biased scores of the group
      float m1 = -std::numeric_limits<float>::infinity(), m2 = m1;
      for (int64_t e = g * per; e < (g + 1) * per; ++e) {
        if (b[e] > m1) {
          m2 = m1;
          m1 = b[e];
        } else if (b[e] > m2) {
          m2 = b[e];
        }
      }
      group_score[g] = m1 + m2;
    }
    std::iota(groups.begin(), groups.end(), 0);
    std::partial_sort(groups.begin(), groups.begin() + p.topk_group, groups.end(), higher(group_score));
    std::fill(kept.begin(), kept.end(), 0);
    for (int64_t j = 0; j < p.topk_group; ++j) kept[groups[j]] = 1;
    cand.clear();
    for (int32_t e = 0; e < E; ++e)
      if (kept[e / per]) cand.push_back(e);
    std::partial_sort(cand.begin(), cand.begin() + K, cand.end(), higher(b));
    std::copy(cand.begin(), cand.begin() + K, r.expert.begin() + t * K);
    set_weights(p, s.data(), r, t);
  }
  return r;
}

Routes sigmoid_grouped_topk_ref(const GroupedTopkParams& p, const float* logits, int64_t n,
                                const std::vector<float>& correction_bias) {
  check(p, correction_bias);
  const int64_t E = p.num_experts, G = p.n_group, per = E / G, K = p.top_k;
  const float kMasked = -std::numeric_limits<float>::infinity();
  Routes r = make_routes(p, logits, n);
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> s(E), choice(E);
    for (int64_t e = 0; e < E; ++e) {
      s[e] = sigmoid(logits[t * E + e]);
      choice[e] = s[e] + (correction_bias.empty() ? 0.0f : correction_bias[e]);
    }
    // Group scores: sort each group descending, add its first two.
    std::vector<std::pair<float, int64_t>> gs;  // (score, group)
    for (int64_t g = 0; g < G; ++g) {
      std::vector<float> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(v.begin(), v.end(), std::greater<float>());
      gs.emplace_back(v[0] + v[1], g);
    }
    std::stable_sort(gs.begin(), gs.end(), [](const auto& a, const auto& c) { return a.first > c.first; });
    std::vector<char> mask(E, 0);
    for (int64_t j = 0; j < p.topk_group; ++j)
      for (int64_t e = gs[j].second * per; e < (gs[j].second + 1) * per; ++e) mask[e] = 1;
    std::vector<std::pair<float, int32_t>> masked;  // (masked choice score, expert)
    for (int32_t e = 0; e < E; ++e) masked.emplace_back(mask[e] ? choice[e] : kMasked, e);
    std::stable_sort(masked.begin(), masked.end(), [](const auto& a, const auto& c) { return a.first > c.first; });
    for (int64_t j = 0; j < K; ++j) r.expert[t * K + j] = masked[j].second;
    set_weights(p, s.data(), r, t);
  }
  return r;
}

}  // namespace moesq::model
