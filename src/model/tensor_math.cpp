// Row operations of the CPU forward (see the header): linear as one OpenBLAS sgemm with its plain-loop
// twin, RMSNorm rows, bias rows and the next-token NLL.
#include "model/tensor_math.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/threads.h"

namespace moesq::model {

void linear(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
              static_cast<int>(K), 1.0f, x, static_cast<int>(K), W, static_cast<int>(K), 0.0f, y,
              static_cast<int>(N));
}

void linear_ref(const float* x, int64_t M, int64_t K, const float* W, int64_t N, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * W[n * K + k];
      y[m * N + n] = acc;
    }
}

int intra_threads(int t) { return t > 0 ? t : num_threads(); }

// RMSNorm of n rows of width D (Qwen3RMSNorm): y = w · x / sqrt(mean(x²) + eps).
// The mean of squares is accumulated in double: torch sums fp32 pairwise, and a double sum is
// closer to that than a naive fp32 loop.
void rmsnorm_rows(const float* x, int64_t n, int64_t D, const float* w, double eps, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * D;
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
    float* yr = y + r * D;
    for (int64_t i = 0; i < D; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

void add_bias_rows(float* y, int64_t n, int64_t N, const std::vector<float>& b) {
  if (b.empty()) return;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < N; ++j) y[r * N + j] += b[j];
}

double next_token_nll(const float* logits, const std::vector<int32_t>& tokens, int64_t V) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  double total = 0.0;
  for (int64_t t = 0; t + 1 < T; ++t) {
    const float* zt = logits + t * V;
    const double mx = *std::max_element(zt, zt + V);
    double se = 0.0;
    for (int64_t v = 0; v < V; ++v) se += std::exp(static_cast<double>(zt[v]) - mx);
    total += (mx + std::log(se)) - static_cast<double>(zt[tokens[t + 1]]);
  }
  return total / static_cast<double>(T - 1);
}

}  // namespace moesq::model
