// A synthetic linear layer with correlated, unevenly scaled inputs (as real MoE expert inputs are)
// for the one-shot solver tests (JSQ, OBR): W [N, K] ~ N(0, 1); X = Z · L · diag(c) with Z [n, K]
// ~ N(0, 1), a random mixing L [K, K] ~ N(0, 1/K) and lognormal channel scales c (σ = 0.75).
// Fixed seeds, fresh values per seed.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "format/nvfp4.h"

namespace moesq::test {

struct CorrelatedLayer {
  int64_t N, K, n;
  std::vector<float> W;  // [N, K]
  std::vector<float> X;  // [n, K]
};

inline std::vector<float> gaussian_vec(size_t count, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(count);
  for (float& x : v) x = d(rng);
  return v;
}

inline CorrelatedLayer correlated_layer(int64_t N, int64_t K, int64_t n, uint32_t seed) {
  CorrelatedLayer l{N, K, n, gaussian_vec(N * K, seed), std::vector<float>(n * K, 0.0f)};
  const auto Z = gaussian_vec(n * K, seed + 1);
  const auto L = gaussian_vec(K * K, seed + 2, 1.0f / std::sqrt(static_cast<float>(K)));
  std::vector<float> chan(K);
  std::mt19937 rng(seed + 3);
  std::lognormal_distribution<float> ln(0.0f, 0.75f);
  for (float& c : chan) c = ln(rng);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t k = 0; k < K; ++k) {
      double s = 0.0;
      for (int64_t j = 0; j < K; ++j) s += static_cast<double>(Z[t * K + j]) * L[j * K + k];
      l.X[t * K + k] = static_cast<float>(s) * chan[k];
    }
  return l;
}

// ‖(W − Ŵ) Xᵀ‖_F / ‖W Xᵀ‖_F over the layer's rows (fp64).
inline double output_rel_error(const CorrelatedLayer& l, const std::vector<float>& What) {
  double num = 0.0, den = 0.0;
  for (int64_t r = 0; r < l.N; ++r)
    for (int64_t t = 0; t < l.n; ++t) {
      double y = 0.0, e = 0.0;
      for (int64_t k = 0; k < l.K; ++k) {
        const double x = l.X[t * l.K + k];
        y += l.W[r * l.K + k] * x;
        e += (l.W[r * l.K + k] - What[r * l.K + k]) * x;
      }
      num += e * e;
      den += y * y;
    }
  return std::sqrt(num / den);
}

inline std::vector<float> dequantized(const format::Sparse48Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.N * t.K));
  format::sparse48_dequantize(t, out.data());
  return out;
}

inline bool same_packed(const format::Sparse48Tensor& a, const format::Sparse48Tensor& b) {
  return a.N == b.N && a.K == b.K && a.values == b.values && a.meta == b.meta && a.scales == b.scales &&
         a.global_scale == b.global_scale;
}

}  // namespace moesq::test
