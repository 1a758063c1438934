// JSQ for paired 4:8 NVFP4 experts (see jsq.h for the algorithm and the adaptation decisions).
#include "compress/jsq.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "compress/pair_scores.h"
#include "core/error.h"

namespace moesq::compress {

namespace {

// The reference replaces an infinite ss with 100 (fp16 overflow of the product).
constexpr double kInfiniteSs = 100.0;

double finite_ss(double v) { return std::isinf(v) ? kInfiniteSs : v; }

// The reference's statistic rows: means of consecutive blocks of `per_mean` rows of X [n, K]
// (floor(n / per_mean) of them; the last n % per_mean rows are dropped). n < per_mean → one mean of
// all n rows (whose range is 0: ss vanishes and the score is the Wanda term alone).
std::vector<float> mean_rows(const float* X, int64_t n, int64_t K, int64_t per_mean, int64_t& rows) {
  rows = n == 0 ? 0 : std::max<int64_t>(1, n / per_mean);
  const int64_t take = n < per_mean ? n : per_mean;
  std::vector<float> out(static_cast<size_t>(rows * K));
  std::vector<double> acc(static_cast<size_t>(K));
  for (int64_t m = 0; m < rows; ++m) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t t = m * take; t < (m + 1) * take; ++t)
      for (int64_t j = 0; j < K; ++j) acc[j] += X[t * K + j];
    for (int64_t j = 0; j < K; ++j) out[m * K + j] = static_cast<float>(acc[j] / static_cast<double>(take));
  }
  return out;
}

}  // namespace

std::vector<float> clip_activations(const float* X, int64_t n, int64_t K, double clip_high) {
  MOESQ_CHECK(clip_high >= 0.0 && clip_high < 1.0, "jsq: clip_high=", clip_high, " must be in [0, 1)");
  std::vector<float> out(X, X + n * K);
  const int64_t total = n * K;
  const auto k = static_cast<int64_t>(clip_high * static_cast<double>(total));
  if (k == 0) return out;
  std::vector<float> mag(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) mag[i] = std::fabs(X[i]);
  // The k-th largest |x| (reference: topk(|x|, k)[-1]).
  std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end(), std::greater<float>());
  const float thr = mag[static_cast<size_t>(k - 1)];
  for (float& x : out) x = std::clamp(x, -thr, thr);
  return out;
}

std::vector<double> jsq_range_salience(const float* W, int64_t N, int64_t K, const float* X, int64_t n) {
  std::vector<double> ss(static_cast<size_t>(N * K), 0.0);
  if (n == 0) return ss;
  std::vector<double> y(static_cast<size_t>(n));   // [n] output o on every row
  std::vector<double> mx(static_cast<size_t>(K)), mn(static_cast<size_t>(K));
  std::vector<double> wo(static_cast<size_t>(K));
  for (int64_t o = 0; o < N; ++o) {
    for (int64_t i = 0; i < K; ++i) wo[i] = W[o * K + i];
    for (int64_t t = 0; t < n; ++t) {
      double s = 0.0;
      for (int64_t i = 0; i < K; ++i) s += static_cast<double>(X[t * K + i]) * wo[i];
      y[t] = s;
    }
    std::fill(mx.begin(), mx.end(), -std::numeric_limits<double>::infinity());
    std::fill(mn.begin(), mn.end(), std::numeric_limits<double>::infinity());
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = X + t * K;
      const double yt = y[t];
      for (int64_t i = 0; i < K; ++i) {
        const double v = yt - static_cast<double>(xt[i]) * wo[i];  // output o with W[o, i] zeroed
        mx[i] = std::max(mx[i], v);
        mn[i] = std::min(mn[i], v);
      }
    }
    for (int64_t i = 0; i < K; ++i) ss[o * K + i] = finite_ss(mx[i] - mn[i]);
  }
  return ss;
}

std::vector<double> jsq_range_salience_ref(const float* W, int64_t N, int64_t K, const float* X, int64_t n) {
  std::vector<double> ss(static_cast<size_t>(N * K), 0.0);
  if (n == 0) return ss;
  std::vector<double> Wz(W, W + N * K);
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t o = 0; o < N; ++o) Wz[o * K + i] = 0.0;  // column i zeroed
    for (int64_t o = 0; o < N; ++o) {
      double hi = -std::numeric_limits<double>::infinity(), lo = std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t < n; ++t) {
        double s = 0.0;
        for (int64_t j = 0; j < K; ++j) s += static_cast<double>(X[t * K + j]) * Wz[o * K + j];
        hi = std::max(hi, s);
        lo = std::min(lo, s);
      }
      ss[o * K + i] = finite_ss(hi - lo);
    }
    for (int64_t o = 0; o < N; ++o) Wz[o * K + i] = W[o * K + i];
  }
  return ss;
}

std::vector<double> jsq_scores(const float* W, int64_t N, int64_t K, const float* X, int64_t n,
                               const JsqOptions& opt) {
  MOESQ_CHECK(opt.rho >= 0.0 && std::isfinite(opt.rho), "jsq: rho=", opt.rho, " must be finite and >= 0");
  MOESQ_CHECK(opt.rows_per_mean > 0, "jsq: rows_per_mean=", opt.rows_per_mean, " must be > 0");
  const std::vector<float> Xc = clip_activations(X, n, K, opt.clip_high);
  std::vector<double> S = wanda_scores(W, N, K, input_column_norms(Xc.data(), n, K));
  if (opt.rho > 0.0) {
    int64_t m = 0;
    const std::vector<float> Xs = mean_rows(Xc.data(), n, K, opt.rows_per_mean, m);
    const std::vector<double> ss = jsq_range_salience(W, N, K, Xs.data(), m);
    for (size_t i = 0; i < S.size(); ++i) S[i] += opt.rho * ss[i];
  }
  return S;
}

JsqResult jsq(const float* W, int64_t N, int64_t K, const float* X, int64_t n, float global_scale,
              const JsqOptions& opt, const std::string& name) {
  MOESQ_CHECK(N > 0 && K > 0 && K % format::kSparseScaleBlock == 0, "jsq: tensor ", name, " has shape [", N, ", ",
              K, "]; K must be a positive multiple of ", format::kSparseScaleBlock);
  for (int64_t i = 0; i < N * K; ++i)
    MOESQ_CHECK(std::isfinite(W[i]), "jsq: tensor ", name, " has a non-finite weight at [", i / K, ", ", i % K, "]");
  JsqResult r;
  if (n == 0) {
    r.fallback = true;
    r.fallback_reason = "no calibration tokens: magnitude patterns + RTN";
    r.patterns = format::magnitude_patterns(W, N, K);
  } else {
    const std::vector<double> S = jsq_scores(W, N, K, X, n, opt);
    r.patterns = patterns_from_scores(S.data(), N, K);
  }
  r.packed = format::sparse48_quantize(W, N, K, r.patterns.data(), global_scale, name);
  return r;
}

SolvedExpert jsq_expert(const model::ExpertWeights& w, int64_t H, int64_t I, const float* X, int64_t n, float gs_gu,
                        float gs_d, const JsqOptions& opt, const std::string (&names)[3],
                        const model::ExpertVariant& variant) {
  // One dense pass: down's input is the ORIGINAL expert's SwiGLU output (see jsq.h).
  std::vector<float> inter;
  if (n > 0) model::swiglu_forward(w.gate.data(), w.up.data(), w.down.data(), H, I, X, n, 0, &inter, variant);
  JsqResult rg = jsq(w.gate.data(), I, H, X, n, gs_gu, opt, names[0]);
  JsqResult ru = jsq(w.up.data(), I, H, X, n, gs_gu, opt, names[1]);
  JsqResult rd = jsq(w.down.data(), H, I, inter.data(), n, gs_d, opt, names[2]);
  SolvedExpert s;
  s.fallback = rg.fallback;
  s.note = rg.fallback_reason;
  s.packed.proj[0] = std::move(rg.packed);
  s.packed.proj[1] = std::move(ru.packed);
  s.packed.proj[2] = std::move(rd.packed);
  return s;
}

}  // namespace moesq::compress
