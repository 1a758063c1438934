// Expert pieces (see the header). The fused-layout unpacking is a pure re-indexing: every value is
// copied, none is rounded, so a compressed gpt-oss checkpoint starts from exactly the source weights.
#include "model/experts/experts.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "core/swiglu.h"
#include "core/threads.h"

namespace moesq::model {

std::vector<float> routed_combine(const Routes& r, int64_t E, int64_t H, const float* x, const ExpertFn& expert,
                                  int threads) {
  const int64_t n = r.n, K = r.k;
  std::vector<std::vector<int64_t>> routes_of(E);  // flat route ids t·k + j, ascending
  for (int64_t i = 0; i < n * K; ++i) {
    const int32_t e = r.expert[i];
    MOESQ_CHECK(e >= 0 && e < E, "routed_combine: route ", i, " names expert ", e, " of ", E);
    routes_of[e].push_back(i);
  }
  std::vector<float> out(n * K * H);  // [n·k, H] unweighted expert outputs per route
  parallel_for(
      E,
      [&](int64_t e) {
        const auto& ids = routes_of[e];
        const int64_t ne = static_cast<int64_t>(ids.size());
        if (ne == 0) return;
        std::vector<float> xe(ne * H);
        for (int64_t i = 0; i < ne; ++i) std::memcpy(&xe[i * H], &x[(ids[i] / K) * H], H * sizeof(float));
        const std::vector<float> ye = expert(e, xe.data(), ne);
        MOESQ_CHECK(static_cast<int64_t>(ye.size()) == ne * H, "routed_combine: expert ", e, " returned ", ye.size(),
                    " values for ", ne, " rows");
        for (int64_t i = 0; i < ne; ++i) std::memcpy(&out[ids[i] * H], &ye[i * H], H * sizeof(float));
      },
      threads > 0 ? threads : num_threads());
  std::vector<float> y(n * H, 0.0f);
  std::vector<int64_t> slot(K);
  for (int64_t t = 0; t < n; ++t) {
    std::iota(slot.begin(), slot.end(), 0);
    std::sort(slot.begin(), slot.end(), [&](int64_t a, int64_t b) { return r.expert[t * K + a] < r.expert[t * K + b]; });
    for (int64_t j : slot) {
      const float w = r.weight[t * K + j];
      const float* o = &out[(t * K + j) * H];
      for (int64_t c = 0; c < H; ++c) y[t * H + c] += o[c] * w;
    }
  }
  return y;
}

void unpack_fused_gate_up(const float* gate_up, const float* gate_up_bias, int64_t E, int64_t H, int64_t I, int64_t e,
                          ExpertWeights& w) {
  MOESQ_CHECK(e >= 0 && e < E, "gpt-oss experts: expert ", e, " of ", E);
  if (gate_up) {
    const float* gu = &gate_up[e * H * 2 * I];  // [H, 2I]
    w.gate.resize(I * H);
    w.up.resize(I * H);
    for (int64_t c = 0; c < H; ++c)
      for (int64_t i = 0; i < I; ++i) {
        w.gate[i * H + c] = gu[c * 2 * I + 2 * i];
        w.up[i * H + c] = gu[c * 2 * I + 2 * i + 1];
      }
  }
  w.gate_bias.resize(I);
  w.up_bias.resize(I);
  for (int64_t i = 0; i < I; ++i) {
    w.gate_bias[i] = gate_up_bias[e * 2 * I + 2 * i];
    w.up_bias[i] = gate_up_bias[e * 2 * I + 2 * i + 1];
  }
}

void unpack_fused_down(const float* down, const float* down_bias, int64_t E, int64_t H, int64_t I, int64_t e,
                       ExpertWeights& w) {
  MOESQ_CHECK(e >= 0 && e < E, "gpt-oss experts: expert ", e, " of ", E);
  if (down) {
    const float* d = &down[e * I * H];  // [I, H]
    w.down.resize(H * I);
    for (int64_t i = 0; i < I; ++i)
      for (int64_t c = 0; c < H; ++c) w.down[c * I + i] = d[i * H + c];
  }
  w.down_bias.assign(down_bias + e * H, down_bias + (e + 1) * H);
}

std::vector<float> gated_shared_expert(const ExpertWeights& w, const std::vector<float>& gate_w, int64_t H, int64_t I,
                                       const float* x, int64_t n) {
  MOESQ_CHECK(static_cast<int64_t>(gate_w.size()) == H, "shared_expert_gate has ", gate_w.size(), " values, expected ", H);
  std::vector<float> y = swiglu_forward(w.gate.data(), w.up.data(), w.down.data(), H, I, x, n, 0);
  for (int64_t t = 0; t < n; ++t) {
    float s = 0.0f;
    for (int64_t c = 0; c < H; ++c) s += x[t * H + c] * gate_w[c];
    const float gsig = sigmoid(s);
    for (int64_t c = 0; c < H; ++c) y[t * H + c] *= gsig;
  }
  return y;
}

}  // namespace moesq::model
