#include "model/mixers/linear.h"

#include <cblas.h>

#include "core/error.h"

namespace moesq::model {

namespace {
void check_shapes(int64_t K, const std::vector<float>& W, int64_t N, const std::vector<float>& bias) {
  MOESQ_CHECK(static_cast<int64_t>(W.size()) == N * K, "linear: weight has ", W.size(), " values, expected [N, K] = [",
              N, ", ", K, "]");
  MOESQ_CHECK(bias.empty() || static_cast<int64_t>(bias.size()) == N, "linear: bias has ", bias.size(),
              " values, expected N = ", N);
}
}  // namespace

void linear(const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N, float* y,
            const std::vector<float>& bias) {
  check_shapes(K, W, N, bias);
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
              1.0f, x, static_cast<int>(K), W.data(), static_cast<int>(K), 0.0f, y, static_cast<int>(N));
  if (!bias.empty())
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) y[m * N + n] += bias[n];
}

void linear_ref(const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N, float* y,
                const std::vector<float>& bias) {
  check_shapes(K, W, N, bias);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * W[n * K + k];
      y[m * N + n] = bias.empty() ? acc : acc + bias[n];
    }
}

}  // namespace moesq::model
