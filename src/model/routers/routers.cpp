// Router (see the header). Selection is one function for both twins: a stable
// partial sort by (score desc, id asc), which is torch.topk's order on distinct scores.
#include "model/routers/routers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace moesq::model {

namespace {

Routes make_routes(int64_t n, int64_t k, int64_t E) {
  MOESQ_CHECK(k >= 1 && k <= E, "router: top-k ", k, " not in [1, ", E, "]");
  Routes r;
  r.n = n;
  r.k = k;
  r.logits.resize(n * E);
  r.expert.resize(n * k);
  r.weight.resize(n * k);
  return r;
}

void logits_blas(const std::vector<float>& W, const std::vector<float>& bias, int64_t E, int64_t H, const float* x,
                 int64_t n, float* z) {
  MOESQ_CHECK(static_cast<int64_t>(W.size()) == E * H, "router: weight has ", W.size(), " values, expected [", E,
              ", ", H, "]");
  if (n > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(E), static_cast<int>(H),
                1.0f, x, static_cast<int>(H), W.data(), static_cast<int>(H), 0.0f, z, static_cast<int>(E));
  if (!bias.empty())
    for (int64_t t = 0; t < n; ++t)
      for (int64_t e = 0; e < E; ++e) z[t * E + e] += bias[e];
}

void logits_loops(const std::vector<float>& W, const std::vector<float>& bias, int64_t E, int64_t H, const float* x,
                  int64_t n, float* z) {
  MOESQ_CHECK(static_cast<int64_t>(W.size()) == E * H, "router: weight has ", W.size(), " values, expected [", E,
              ", ", H, "]");
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < E; ++e) {
      float acc = 0.0f;
      for (int64_t c = 0; c < H; ++c) acc += x[t * H + c] * W[e * H + c];
      z[t * E + e] = acc + (bias.empty() ? 0.0f : bias[e]);
    }
}

// Top-k ids of score[0..E) into ids (descending score, ties to the lower id).
void top_k(const float* score, int64_t E, int64_t k, std::vector<int32_t>& order) {
  order.resize(E);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return score[a] > score[b] || (score[a] == score[b] && a < b); });
}

void softmax_topk_select(Routes& r, int64_t E, bool renormalize) {
  std::vector<float> p(E);
  std::vector<int32_t> order;
  for (int64_t t = 0; t < r.n; ++t) {
    const float* z = &r.logits[t * E];
    const float mx = *std::max_element(z, z + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(z[e] - mx));
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    top_k(p.data(), E, r.k, order);
    float wsum = 0.0f;
    for (int64_t j = 0; j < r.k; ++j) wsum += p[order[j]];
    for (int64_t j = 0; j < r.k; ++j) {
      r.expert[t * r.k + j] = order[j];
      r.weight[t * r.k + j] = renormalize ? p[order[j]] / wsum : p[order[j]];
    }
  }
}

}  // namespace

Routes softmax_topk_route(const std::vector<float>& W, int64_t E, int64_t H, const float* x, int64_t n, int64_t k,
                          bool renormalize) {
  Routes r = make_routes(n, k, E);
  logits_blas(W, {}, E, H, x, n, r.logits.data());
  softmax_topk_select(r, E, renormalize);
  return r;
}

Routes softmax_topk_route_ref(const std::vector<float>& W, int64_t E, int64_t H, const float* x, int64_t n,
                              int64_t k, bool renormalize) {
  Routes r = make_routes(n, k, E);
  logits_loops(W, {}, E, H, x, n, r.logits.data());
  softmax_topk_select(r, E, renormalize);
  return r;
}

}  // namespace moesq::model
