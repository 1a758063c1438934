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
}

void router_topk_ref(const RouterTopkArgs& a) {
  router_topk_check(a);
  const int E = a.num_experts;
  std::vector<float> p(E);
  std::vector<char> taken(E);
  for (int64_t t = 0; t < a.T; ++t) {
    const float* z = a.logits + t * E;
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
    std::fill(taken.begin(), taken.end(), 0);
    float wsum = 0.0f;
    for (int j = 0; j < a.topk; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
      taken[best] = 1;
      a.topk_ids[t * a.topk + j] = best;
      a.topk_w[t * a.topk + j] = p[best];
      wsum += p[best];
    }
    if (a.norm_topk_prob)
      for (int j = 0; j < a.topk; ++j) a.topk_w[t * a.topk + j] /= wsum;
  }
}

}  // namespace moesq::ops
