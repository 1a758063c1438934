#include "compress/pair_scores.h"

#include <cmath>

#include "core/error.h"
#include "format/nvfp4.h"

namespace moesq::compress {

std::vector<uint8_t> patterns_from_scores(const double* score, int64_t N, int64_t K) {
  MOESQ_CHECK(K % format::kGroup == 0, "pair scores: K=", K, " is not a multiple of ", format::kGroup);
  const int64_t G = K / format::kGroup;
  std::vector<uint8_t> pat(static_cast<size_t>(N * G));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t g = 0; g < G; ++g) {
      double pair[format::kGroup / 2];
      for (int p = 0; p < format::kGroup / 2; ++p) {
        const int64_t j = g * format::kGroup + 2 * p;
        const double a = score[r * K + j], b = score[r * K + j + 1];
        MOESQ_CHECK(std::isfinite(a) && std::isfinite(b), "pair scores: non-finite score at [", r, ", ",
                    std::isfinite(a) ? j + 1 : j, "]");
        pair[p] = a + b;
      }
      int best = 0;
      double best_s = -INFINITY;
      for (int pt = 0; pt < format::kNumPatterns; ++pt) {
        const double s = pair[format::kPatternPairs[pt][0]] + pair[format::kPatternPairs[pt][1]];
        if (s > best_s) best_s = s, best = pt;
      }
      pat[r * G + g] = static_cast<uint8_t>(best);
    }
  return pat;
}

std::vector<double> input_column_norms(const float* X, int64_t n, int64_t K) {
  std::vector<double> norm(static_cast<size_t>(K), 0.0);
  if (n == 0) return norm;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const double x = X[t * K + j];
      norm[j] += x * x;
    }
  for (double& v : norm) v = std::sqrt(v / static_cast<double>(n));
  return norm;
}

std::vector<double> wanda_scores(const float* W, int64_t N, int64_t K, const std::vector<double>& norm) {
  MOESQ_CHECK(static_cast<int64_t>(norm.size()) == K, "wanda: ", norm.size(), " column norms for K=", K);
  std::vector<double> s(static_cast<size_t>(N * K));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t j = 0; j < K; ++j) s[r * K + j] = std::fabs(static_cast<double>(W[r * K + j])) * norm[j];
  return s;
}

}  // namespace moesq::compress
