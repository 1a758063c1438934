#include "compress/expert_math.h"

#include <cblas.h>

#include <cmath>
#include <limits>

#include "format/nvfp4.h"

namespace moesq::compress {

std::vector<float> expert_forward(const ExpertShape& s, const float* gate, const float* up, const float* down,
                                  const float* x, int64_t n, int act_block, std::vector<float>* inter) {
  const int64_t H = s.H, I = s.I;
  std::vector<float> y(static_cast<size_t>(n * H), 0.0f);
  if (n == 0) {
    if (inter) inter->clear();
    return y;
  }
  std::vector<float> xq(x, x + n * H);
  if (act_block > 0)
    for (int64_t r = 0; r < n; ++r) format::quantize_activation_row(xq.data() + r * H, H, act_block);
  std::vector<float> g(static_cast<size_t>(n * I)), u(static_cast<size_t>(n * I));
  // [n, H] × [I, H]ᵀ → [n, I]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(I),
              static_cast<int>(H), 1.0f, xq.data(), static_cast<int>(H), gate, static_cast<int>(H), 0.0f,
              g.data(), static_cast<int>(I));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(I),
              static_cast<int>(H), 1.0f, xq.data(), static_cast<int>(H), up, static_cast<int>(H), 0.0f,
              u.data(), static_cast<int>(I));
  for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  if (act_block > 0)
    for (int64_t r = 0; r < n; ++r) format::quantize_activation_row(g.data() + r * I, I, act_block);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(H),
              static_cast<int>(I), 1.0f, g.data(), static_cast<int>(I), down, static_cast<int>(I), 0.0f,
              y.data(), static_cast<int>(H));
  if (inter) *inter = std::move(g);
  return y;
}

double rel_sq_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(a[i]) * a[i];
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  return num / den;
}

}  // namespace moesq::compress
