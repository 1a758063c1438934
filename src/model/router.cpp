// Router selection (model/router.h). The softmax path's evaluation order (fp32 max-subtracted exp, a
// float sum, divide, then the top-k sum) is the one the Qwen3-MoE parity tests were measured with;
// it must stay as is for the compressed checkpoints' hashes to hold.
#include "model/router.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/threads.h"

namespace moesq::model {

RouterSpec router_spec(const io::ModelSpec& s) {
  RouterSpec r;
  r.num_experts = s.num_experts;
  r.top_k = s.top_k;
  r.scoring = s.router_scoring;
  r.correction_bias = s.router_correction_bias;
  r.n_group = s.n_group;
  r.topk_group = s.topk_group;
  r.norm_topk_prob = s.norm_topk_prob;
  r.routed_scaling_factor = s.routed_scaling_factor;
  return r;
}

namespace {

// Sigmoid scores → selection scores c [E] with grouped masking (DeepSeek-V3 route_tokens_to_experts).
void grouped_choice(const RouterSpec& rs, const float* p, const float* bias, float* c) {
  const int64_t E = rs.num_experts, G = rs.n_group, per = E / G;
  for (int64_t e = 0; e < E; ++e) c[e] = p[e] + (bias ? bias[e] : 0.0f);
  if (G <= 1) return;
  std::vector<float> gscore(G);
  for (int64_t g = 0; g < G; ++g) {  // sum of the two best choice scores of the group
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int64_t e = g * per; e < (g + 1) * per; ++e) {
      if (c[e] > b1) {
        b2 = b1;
        b1 = c[e];
      } else if (c[e] > b2) {
        b2 = c[e];
      }
    }
    gscore[g] = per >= 2 ? b1 + b2 : b1;
  }
  std::vector<int64_t> gorder(G);
  std::iota(gorder.begin(), gorder.end(), 0);
  std::partial_sort(gorder.begin(), gorder.begin() + rs.topk_group, gorder.end(), [&](int64_t a, int64_t b) {
    return gscore[a] > gscore[b] || (gscore[a] == gscore[b] && a < b);
  });
  std::vector<char> keep(G, 0);
  for (int64_t i = 0; i < rs.topk_group; ++i) keep[gorder[i]] = 1;
  for (int64_t e = 0; e < E; ++e)
    if (!keep[e / per]) c[e] = 0.0f;  // transformers: masked_fill(~mask, 0.0)
}

// GptOssTopKRouter: top-k of the logits z (ties to the lower id), weights = softmax over those k
// logits in fp32 (max-subtracted). Every weight set sums to one, so there is no renormalisation step.
void topk_softmax_row(const float* z, int64_t E, int64_t K, std::vector<int32_t>& order, int32_t* ids, float* w) {
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + K, order.end(),
                    [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  const float mx = z[order[0]];
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j) sum += (w[j] = std::exp(z[order[j]] - mx));
  for (int64_t j = 0; j < K; ++j) {
    ids[j] = order[j];
    w[j] /= sum;
  }
}

}  // namespace

Routes select_routes(const RouterSpec& rs, std::vector<float> logits, int64_t n, const float* bias) {
  const int64_t E = rs.num_experts, K = rs.top_k;
  MOESQ_CHECK(K >= 1 && K <= E, "route: num_experts_per_tok ", K, " not in [1, ", E, "]");
  MOESQ_CHECK(static_cast<int64_t>(logits.size()) == n * E, "route: ", logits.size(), " router logits, expected n·E = ",
              n * E);
  MOESQ_CHECK(rs.n_group >= 1 && E % rs.n_group == 0 && rs.topk_group >= 1 && rs.topk_group <= rs.n_group,
              "route: n_group = ", rs.n_group, ", topk_group = ", rs.topk_group, " do not fit ", E, " experts");
  MOESQ_CHECK(rs.scoring == io::RouterScoring::Sigmoid || (rs.n_group == 1 && !rs.correction_bias),
              "route: grouped top-k and the correction bias apply to sigmoid routers only");
  MOESQ_CHECK(!rs.correction_bias || bias, "route: the router needs its e_score_correction_bias");
  Routes r;
  r.n = n;
  r.k = K;
  r.logits = std::move(logits);
  r.expert.resize(n * K);
  r.weight.resize(n * K);
  const bool sigmoid = rs.scoring == io::RouterScoring::Sigmoid;
  // Rows [t0, t1) with their own scratch: every row is independent, so chunks on threads give the bits
  // of one pass (a calibration layer routes 262,144 rows; the engine's calls route a few).
  auto route_rows = [&](int64_t t0, int64_t t1) {
    std::vector<float> p(E), c(E);
    std::vector<int32_t> order(E);
    for (int64_t t = t0; t < t1; ++t) {
      const float* z = &r.logits[t * E];
      if (rs.scoring == io::RouterScoring::TopkSoftmax) {
        topk_softmax_row(z, E, K, order, &r.expert[t * K], &r.weight[t * K]);
        continue;
      }
      if (sigmoid) {
        for (int64_t e = 0; e < E; ++e) p[e] = 1.0f / (1.0f + std::exp(-z[e]));
        grouped_choice(rs, p.data(), rs.correction_bias ? bias : nullptr, c.data());
      } else {
        const float mx = *std::max_element(z, z + E);
        float sum = 0.0f;
        for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - mx));
        for (int64_t e = 0; e < E; ++e) p[e] /= sum;
      }
      const std::vector<float>& score = sigmoid ? c : p;
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
        return score[a] > score[b] || (score[a] == score[b] && a < b);
      });
      float wsum = 0.0f;
      for (int64_t j = 0; j < K; ++j) wsum += p[order[j]];
      if (sigmoid) wsum += 1e-20f;
      for (int64_t j = 0; j < K; ++j) {
        float w = rs.norm_topk_prob ? p[order[j]] / wsum : p[order[j]];
        if (rs.routed_scaling_factor != 1.0) w *= static_cast<float>(rs.routed_scaling_factor);
        r.expert[t * K + j] = order[j];
        r.weight[t * K + j] = w;
      }
    }
  };
  constexpr int64_t kChunk = 4096;
  if (n < 2 * kChunk) {
    route_rows(0, n);
  } else {
    parallel_for((n + kChunk - 1) / kChunk, [&](int64_t i) { route_rows(i * kChunk, std::min(n, (i + 1) * kChunk)); });
  }
  return r;
}

}  // namespace moesq::model
