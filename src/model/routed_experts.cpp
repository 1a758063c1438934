#include "model/routed_experts.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/swiglu.h"
#include "core/threads.h"
#include "format/nvfp4.h"
#include "model/mixers/linear.h"

namespace moesq::model {

namespace {

void check(const std::vector<ExpertWeights>& experts, int64_t H, const std::vector<float>& x, const Routes& r,
           int64_t layer) {
  MOESQ_CHECK(static_cast<int64_t>(x.size()) == r.n * H, "layer ", layer, " routed experts: x has ", x.size(),
              " values, expected n·H = ", r.n * H);
  const int64_t E = static_cast<int64_t>(experts.size());
  for (int64_t i = 0; i < r.n * r.k; ++i)
    MOESQ_CHECK(r.expert[i] >= 0 && r.expert[i] < E, "layer ", layer, " routed experts: route ", i, " names expert ",
                r.expert[i], " of ", E);
}

// Weighted sum per token over its k routes, in ascending expert id order; out: [n·k, H] per route.
std::vector<float> combine(const Routes& r, int64_t H, const std::vector<float>& out) {
  const int64_t K = r.k;
  std::vector<float> y(r.n * H, 0.0f);
  std::vector<int64_t> slot(K);
  for (int64_t t = 0; t < r.n; ++t) {
    std::iota(slot.begin(), slot.end(), 0);
    std::sort(slot.begin(), slot.end(), [&](int64_t a, int64_t b) { return r.expert[t * K + a] < r.expert[t * K + b]; });
    float* yt = &y[t * H];
    for (int64_t j : slot) {
      const float w = r.weight[t * K + j];
      const float* o = &out[(t * K + j) * H];
      for (int64_t c = 0; c < H; ++c) yt[c] += o[c] * w;
    }
  }
  return y;
}

}  // namespace

std::vector<float> routed_experts_forward(const std::vector<ExpertWeights>& experts, int64_t H, int64_t I,
                                          const std::vector<float>& x, const Routes& r, const ForwardOptions& fo,
                                          int64_t layer) {
  check(experts, H, x, r, layer);
  const int64_t E = static_cast<int64_t>(experts.size()), K = r.k;
  std::vector<std::vector<int64_t>> routes_of(E);  // flat route ids t·k + j of each expert, ascending
  for (int64_t i = 0; i < r.n * K; ++i) routes_of[r.expert[i]].push_back(i);
  std::vector<float> out(r.n * K * H);  // [n·k, H] unweighted expert output of each route
  parallel_for(
      E,
      [&](int64_t e) {
        const auto& ids = routes_of[e];
        const int64_t ne = static_cast<int64_t>(ids.size());
        if (ne == 0) return;
        std::vector<float> xe(ne * H);  // [n_e, H]
        for (int64_t i = 0; i < ne; ++i) std::memcpy(&xe[i * H], &x[(ids[i] / K) * H], H * sizeof(float));
        const ExpertWeights& W = experts[e];
        std::vector<float> ye;
        try {
          ye = swiglu_forward(W.gate.data(), W.up.data(), W.down.data(), H, I, xe.data(), ne, fo.expert_act_block());
        } catch (const Error& err) {
          MOESQ_FAIL("layer ", layer, " expert ", e, ": ", err.what());
        }
        for (int64_t i = 0; i < ne; ++i) std::memcpy(&out[ids[i] * H], &ye[i * H], H * sizeof(float));
      },
      fo.threads > 0 ? fo.threads : num_threads());
  return combine(r, H, out);
}

std::vector<float> routed_experts_forward_ref(const std::vector<ExpertWeights>& experts, int64_t H, int64_t I,
                                              const std::vector<float>& x, const Routes& r, const ForwardOptions& fo,
                                              int64_t layer) {
  check(experts, H, x, r, layer);
  const int block = fo.expert_act_block();
  std::vector<float> out(r.n * r.k * H), xin(H), g(I), u(I);
  for (int64_t i = 0; i < r.n * r.k; ++i) {
    const ExpertWeights& W = experts[r.expert[i]];
    std::copy(&x[(i / r.k) * H], &x[(i / r.k) * H] + H, xin.begin());
    if (block > 0) format::quantize_activation_row(xin.data(), H, block);
    linear_ref(xin.data(), 1, H, W.gate, I, g.data());
    linear_ref(xin.data(), 1, H, W.up, I, u.data());
    for (int64_t c = 0; c < I; ++c) g[c] = silu_mul(g[c], u[c]);
    if (block > 0) format::quantize_activation_row(g.data(), I, block);
    linear_ref(g.data(), 1, I, W.down, H, &out[i * H]);
  }
  return combine(r, H, out);
}

}  // namespace moesq::model
