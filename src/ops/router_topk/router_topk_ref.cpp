// CPU twin of ops::router_topk (the kernel's sum is a strided-lane butterfly, replayed here).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/router_topk/router_topk.h"

namespace moesq::ops {

void router_topk_check(const RouterTopkArgs& a) {
  MOESQ_CHECK(a.num_experts > 0 && a.num_experts <= 512, "router_topk: E=", a.num_experts, " not in [1, 512]");
  MOESQ_CHECK(a.topk >= 1 && a.topk <= std::min(a.num_experts, 32), "router_topk: k=", a.topk, " not in [1, ",
              std::min(a.num_experts, 32), "]");
  MOESQ_CHECK(a.T >= 0, "router_topk: T=", a.T);
  MOESQ_CHECK(!(a.sigmoid && a.topk_softmax), "router_topk: sigmoid and topk_softmax are two scorings; set one");
  MOESQ_CHECK(a.sigmoid || (a.n_group == 1 && a.topk_group == 1 && !a.correction_bias),
              "router_topk: grouped top-k and the correction bias apply to the sigmoid scoring only");
  MOESQ_CHECK(a.n_group >= 1 && a.n_group <= 32 && a.num_experts % a.n_group == 0 && a.topk_group >= 1 &&
                  a.topk_group <= a.n_group,
              "router_topk: n_group=", a.n_group, " topk_group=", a.topk_group, " do not fit E=", a.num_experts,
              " (n_group ≤ 32 dividing E, 1 ≤ topk_group ≤ n_group)");
  MOESQ_CHECK(a.topk <= (a.num_experts / a.n_group) * a.topk_group || a.n_group == 1, "router_topk: k=", a.topk,
              " is more than the ", (a.num_experts / a.n_group) * a.topk_group, " experts of the kept groups");
}

namespace {

// The sigmoid scoring's choice scores (router_topk.h), in the kernel's operation order: p, c = p + b,
// each group's two best c (ascending e), the topk_group best groups (ties → lower group), masked c = 0.
void sigmoid_choice(const RouterTopkArgs& a, const float* z, float* p, float* c) {
  const int E = a.num_experts, G = a.n_group, per = E / G;
  for (int e = 0; e < E; ++e) {
    p[e] = 1.0f / (1.0f + std::exp(-z[e]));
    c[e] = a.correction_bias ? p[e] + a.correction_bias[e] : p[e];
  }
  if (G <= 1) return;
  float gscore[32];
  for (int g = 0; g < G; ++g) {
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int e = g * per; e < (g + 1) * per; ++e) {
      if (c[e] > b1) {
        b2 = b1, b1 = c[e];
      } else if (c[e] > b2) {
        b2 = c[e];
      }
    }
    gscore[g] = per >= 2 ? b1 + b2 : b1;
  }
  bool keep[32] = {};
  for (int i = 0; i < a.topk_group; ++i) {
    int best = -1;
    for (int g = 0; g < G; ++g)
      if (!keep[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
    keep[best] = true;
  }
  for (int e = 0; e < E; ++e)
    if (!keep[e / per]) c[e] = 0.0f;
}

}  // namespace

void router_topk_ref(const RouterTopkArgs& a) {
  router_topk_check(a);
  if (a.counts) std::fill(a.counts, a.counts + a.num_experts, 0);
  const int E = a.num_experts;
  std::vector<float> p(E), c(E), zb(E);
  std::vector<char> taken(E);
  for (int64_t t = 0; t < a.T; ++t) {
    const float* z = a.logits + t * E;
    if (a.logit_bias) {
      for (int e = 0; e < E; ++e) zb[e] = z[e] + a.logit_bias[e];
      z = zb.data();
    }
    if (a.topk_softmax) {
      std::copy(z, z + E, p.begin());  // the top-k of z (+ bias); weights exp(z_j − z_first) / Σ below
    } else if (a.sigmoid) {
      sigmoid_choice(a, z, p.data(), c.data());
    } else {
      const float mx = *std::max_element(z, z + E);
      float part[32];
      for (int l = 0; l < 32; ++l) {
        float s = 0.0f;
        for (int e = l; e < E; e += 32) s += (p[e] = std::exp(z[e] - mx));
        part[l] = s;
      }
      for (int h = 1; h < 32; h *= 2) {
        float q[32];
        for (int l = 0; l < 32; ++l) q[l] = part[l] + part[l ^ h];
        std::copy(q, q + 32, part);
      }
      for (int e = 0; e < E; ++e) p[e] /= part[0];
    }
    const std::vector<float>& score = a.sigmoid ? c : p;
    std::fill(taken.begin(), taken.end(), 0);
    float wsum = 0.0f;
    for (int j = 0; j < a.topk; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || score[e] > score[best])) best = e;
      taken[best] = 1;
      a.topk_ids[t * a.topk + j] = best;
      const float w = a.topk_softmax ? std::exp(p[best] - p[a.topk_ids[t * a.topk]]) : p[best];
      a.topk_w[t * a.topk + j] = w;
      wsum += w;
    }
    if (a.topk_softmax) {  // the softmax over the k: normalized whatever norm_topk_prob, never scaled
      for (int j = 0; j < a.topk; ++j) a.topk_w[t * a.topk + j] /= wsum;
      continue;
    }
    if (a.sigmoid) wsum += 1e-20f;
    for (int j = 0; j < a.topk; ++j) {
      float& w = a.topk_w[t * a.topk + j];
      if (a.norm_topk_prob) w /= wsum;
      if (a.routed_scaling_factor != 1.0f) w *= a.routed_scaling_factor;
    }
  }
}

}  // namespace moesq::ops
