// Expert pieces (see the header). The clamped SwiGLU follows GptOssExperts' fp32 order exactly:
// clamp, then glu = g · σ(g · alpha), then (u + 1) · glu.
#include "model/experts/experts.h"

#include <cblas.h>

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

namespace {

float clamped_glu(float g, float u, float alpha, float limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return (u + 1.0f) * (g * sigmoid(g * alpha));
}

void check_biased(const BiasedExpertWeights& w, int64_t H, int64_t I) {
  MOESQ_CHECK(static_cast<int64_t>(w.gate.size()) == I * H && static_cast<int64_t>(w.up.size()) == I * H &&
                  static_cast<int64_t>(w.down.size()) == H * I && static_cast<int64_t>(w.gate_bias.size()) == I &&
                  static_cast<int64_t>(w.up_bias.size()) == I && static_cast<int64_t>(w.down_bias.size()) == H,
              "clamped_swiglu: weights do not match H = ", H, ", I = ", I);
}

void gemm_nt(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y) {
  if (M == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
              1.0f, x, static_cast<int>(K), W, static_cast<int>(K), 0.0f, y, static_cast<int>(N));
}

}  // namespace

std::vector<float> clamped_swiglu_forward(const BiasedExpertWeights& w, int64_t H, int64_t I, const float* x,
                                          int64_t n, double alpha, double limit) {
  check_biased(w, H, I);
  std::vector<float> g(n * I), u(n * I), y(n * H);
  gemm_nt(x, n, H, w.gate.data(), I, g.data());
  gemm_nt(x, n, H, w.up.data(), I, u.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < I; ++i)
      g[t * I + i] = clamped_glu(g[t * I + i] + w.gate_bias[i], u[t * I + i] + w.up_bias[i], static_cast<float>(alpha),
                                 static_cast<float>(limit));
  gemm_nt(g.data(), n, I, w.down.data(), H, y.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < H; ++c) y[t * H + c] += w.down_bias[c];
  return y;
}

std::vector<float> clamped_swiglu_forward_ref(const BiasedExpertWeights& w, int64_t H, int64_t I, const float* x,
                                              int64_t n, double alpha, double limit) {
  check_biased(w, H, I);
  std::vector<float> h(I), y(n * H);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < I; ++i) {
      float g = 0.0f, u = 0.0f;
      for (int64_t c = 0; c < H; ++c) {
        g += x[t * H + c] * w.gate[i * H + c];
        u += x[t * H + c] * w.up[i * H + c];
      }
      h[i] = clamped_glu(g + w.gate_bias[i], u + w.up_bias[i], static_cast<float>(alpha), static_cast<float>(limit));
    }
    for (int64_t c = 0; c < H; ++c) {
      float acc = 0.0f;
      for (int64_t i = 0; i < I; ++i) acc += h[i] * w.down[c * I + i];
      y[t * H + c] = acc + w.down_bias[c];
    }
  }
  return y;
}

BiasedExpertWeights unpack_gpt_oss_expert(const std::vector<float>& gate_up, const std::vector<float>& gate_up_bias,
                                          const std::vector<float>& down, const std::vector<float>& down_bias,
                                          int64_t E, int64_t H, int64_t I, int64_t e) {
  MOESQ_CHECK(static_cast<int64_t>(gate_up.size()) == E * H * 2 * I &&
                  static_cast<int64_t>(gate_up_bias.size()) == E * 2 * I &&
                  static_cast<int64_t>(down.size()) == E * I * H && static_cast<int64_t>(down_bias.size()) == E * H,
              "gpt-oss experts: fused tensors do not match E = ", E, ", H = ", H, ", I = ", I);
  BiasedExpertWeights w;
  w.gate.resize(I * H);
  w.up.resize(I * H);
  w.down.resize(H * I);
  w.gate_bias.resize(I);
  w.up_bias.resize(I);
  const float* gu = &gate_up[e * H * 2 * I];  // [H, 2I]
  for (int64_t c = 0; c < H; ++c)
    for (int64_t i = 0; i < I; ++i) {
      w.gate[i * H + c] = gu[c * 2 * I + 2 * i];
      w.up[i * H + c] = gu[c * 2 * I + 2 * i + 1];
    }
  for (int64_t i = 0; i < I; ++i) {
    w.gate_bias[i] = gate_up_bias[e * 2 * I + 2 * i];
    w.up_bias[i] = gate_up_bias[e * 2 * I + 2 * i + 1];
  }
  const float* d = &down[e * I * H];  // [I, H]
  for (int64_t i = 0; i < I; ++i)
    for (int64_t c = 0; c < H; ++c) w.down[c * I + i] = d[i * H + c];
  w.down_bias.assign(down_bias.begin() + e * H, down_bias.begin() + (e + 1) * H);
  return w;
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
