// OBR for paired 4:8 NVFP4 experts (see obr.h for the algorithm and the adaptation).
// Non-obvious decision: the closed forms of steps 2–3 are solved per row on the damped Hessian's
// kept-set submatrix (one Cholesky of size K/2, one of size ~K/4 per row), as the reference does,
// rather than through a shared inverse: every row has its own kept set.
#include "compress/obr.h"

#include <algorithm>
#include <cmath>

#include "compress/pair_scores.h"
#include "core/error.h"

namespace moesq::compress {

namespace {

// Solves A x = b for SPD A [m, m] (row-major, overwritten by its Cholesky factor); b → x in place.
// Returns false when A is not numerically PD (pivot <= kMinPivotRel · max diag A).
bool solve_spd(std::vector<double>& A, int64_t m, std::vector<double>& b, bool use_lapack) {
  if (m == 0) return true;
  double max_diag = 0.0;
  for (int64_t i = 0; i < m; ++i) max_diag = std::max(max_diag, A[i * m + i]);
  const double min_pivot = kMinPivotRel * max_diag;
  if (!(use_lapack ? cholesky_lower(A, m, min_pivot) : cholesky_lower_ref(A, m, min_pivot))) return false;
  for (int64_t i = 0; i < m; ++i) {  // L y = b
    double s = b[i];
    for (int64_t j = 0; j < i; ++j) s -= A[i * m + j] * b[j];
    b[i] = s / A[i * m + i];
  }
  for (int64_t i = m - 1; i >= 0; --i) {  // Lᵀ x = y
    double s = b[i];
    for (int64_t j = i + 1; j < m; ++j) s -= A[j * m + i] * b[j];
    b[i] = s / A[i * m + i];
  }
  return true;
}

// x ← A_rows,cols · v_cols for index lists (the H̃_IZ w_Z products).
std::vector<double> sub_matvec(const std::vector<double>& Hd, int64_t K, const std::vector<int64_t>& rows,
                               const std::vector<int64_t>& cols, const double* v) {
  std::vector<double> out(rows.size(), 0.0);
  for (size_t a = 0; a < rows.size(); ++a) {
    const double* hr = Hd.data() + rows[a] * K;
    double s = 0.0;
    for (int64_t c : cols) s += hr[c] * v[c];
    out[a] = s;
  }
  return out;
}

std::vector<double> sub_matrix(const std::vector<double>& Hd, int64_t K, const std::vector<int64_t>& idx) {
  const auto m = static_cast<int64_t>(idx.size());
  std::vector<double> A(static_cast<size_t>(m * m));
  for (int64_t a = 0; a < m; ++a)
    for (int64_t b = 0; b < m; ++b) A[a * m + b] = Hd[idx[a] * K + idx[b]];
  return A;
}

ObrResult run(const float* W, int64_t N, int64_t K, const Hessian& h, float gamma, const ObrOptions& opt,
              const SgptqOptions& sg, const std::string& name, bool use_lapack) {
  MOESQ_CHECK(N > 0 && K > 0 && K % format::kSparseScaleBlock == 0, "obr: tensor ", name, " has shape [", N, ", ",
              K, "]; K must be a positive multiple of ", format::kSparseScaleBlock);
  MOESQ_CHECK(opt.alpha >= 0.0 && opt.alpha <= 1.0, "obr: alpha=", opt.alpha, " must be in [0, 1]");
  MOESQ_CHECK(sg.percdamp >= 0.0 && std::isfinite(sg.percdamp), "obr: percdamp=", sg.percdamp,
              " must be finite and >= 0");
  MOESQ_CHECK(h.n == 0 || (h.K == K && static_cast<int64_t>(h.H.size()) == K * K), "obr: tensor ", name, " has K=",
              K, " but its Hessian has K=", h.K);
  for (int64_t i = 0; i < N * K; ++i)
    MOESQ_CHECK(std::isfinite(W[i]), "obr: tensor ", name, " has a non-finite weight at [", i / K, ", ", i % K, "]");
  if (!(gamma > 0.0f)) gamma = format::nvfp4_tensor_scale(format::amax_abs(W, N * K));

  ObrResult r;
  const int64_t blocks = K / format::kSparseScaleBlock;
  r.split = std::clamp<int64_t>(std::llround(opt.alpha * static_cast<double>(blocks)), 0, blocks) *
            format::kSparseScaleBlock;
  bool finite_h = h.n > 0;
  for (double v : h.H) finite_h = finite_h && std::isfinite(v);
  if (!finite_h) {
    r.fallback = true;
    r.fallback_reason = h.n == 0 ? "no calibration tokens: magnitude patterns + RTN"
                                 : "non-finite Hessian: magnitude patterns + RTN";
    r.patterns = format::magnitude_patterns(W, N, K);
    r.compensated.assign(W, W + N * K);
    format::apply_patterns(r.compensated.data(), N, K, r.patterns.data(), name);
    r.packed = format::sparse48_quantize(W, N, K, r.patterns.data(), gamma, name);
    return r;
  }

  // Damped Hessian with dead inputs handled as GPTQ does (gptq_fixed_support repeats the same on h).
  std::vector<double> Hd = h.H;
  std::vector<float> Wd(W, W + N * K);
  std::vector<double> norm(static_cast<size_t>(K));
  for (int64_t j = 0; j < K; ++j) {
    norm[j] = std::sqrt(std::max(0.0, h.H[j * K + j]) / 2.0);  // ‖X_j‖₂ / √n
    if (Hd[j * K + j] == 0.0) {
      Hd[j * K + j] = 1.0;
      for (int64_t row = 0; row < N; ++row) Wd[row * K + j] = 0.0f;
    }
  }
  double mean_diag = 0.0;
  for (int64_t j = 0; j < K; ++j) mean_diag += Hd[j * K + j];
  const double damp = sg.percdamp * mean_diag / static_cast<double>(K);
  for (int64_t j = 0; j < K; ++j) Hd[j * K + j] += damp;

  // Step 1.
  const std::vector<double> S = wanda_scores(Wd.data(), N, K, norm);
  r.patterns = patterns_from_scores(S.data(), N, K);

  // Steps 2–3, row by row.
  const int64_t G = K / format::kGroup;
  r.compensated.assign(static_cast<size_t>(N * K), 0.0f);
  std::vector<double> w(static_cast<size_t>(K)), e(static_cast<size_t>(K), 0.0);
  std::vector<uint8_t> kept(static_cast<size_t>(K));
  std::vector<float> wf(static_cast<size_t>(K)), qf(static_cast<size_t>(K));
  for (int64_t row = 0; row < N; ++row) {
    const uint8_t* rp = r.patterns.data() + row * G;
    for (int64_t j = 0; j < K; ++j) {
      kept[j] = (format::pattern_mask8(rp[j / format::kGroup]) >> (j % format::kGroup)) & 1u;
      w[j] = Wd[row * K + j];
    }
    bool ok = obr_prune_compensate_row(w.data(), kept.data(), Hd, K, use_lapack);
    if (!ok)
      for (int64_t j = 0; j < K; ++j) w[j] = kept[j] ? w[j] : 0.0;
    if (r.split > 0 && r.split < K) {
      for (int64_t j = 0; j < K; ++j) wf[j] = static_cast<float>(w[j]);
      const format::Sparse48Tensor q1 = format::sparse48_quantize(wf.data(), 1, K, rp, gamma, name);
      format::sparse48_dequantize(q1, qf.data());
      for (int64_t j = 0; j < r.split; ++j) e[j] = static_cast<double>(wf[j]) - qf[j];
      ok = obr_quant_compensate_row(w.data(), kept.data(), e.data(), r.split, Hd, K, use_lapack) && ok;
    }
    if (!ok) ++r.rows_uncompensated;
    for (int64_t j = 0; j < K; ++j) r.compensated[row * K + j] = static_cast<float>(w[j]);
  }

  // Step 4.
  const int64_t gptq_from = opt.rtn ? K : r.split;
  SgptqResult q = use_lapack ? gptq_fixed_support(r.compensated.data(), N, K, h, gamma, r.patterns.data(), gptq_from, sg, name)
                             : gptq_fixed_support_ref(r.compensated.data(), N, K, h, gamma, r.patterns.data(), gptq_from,
                                                      sg, name);
  if (q.fallback) {
    r.fallback = true;
    r.fallback_reason = q.fallback_reason + " (OBR compensation kept, final step RTN)";
  }
  r.packed = std::move(q.packed);
  return r;
}

}  // namespace

bool obr_prune_compensate_row(double* w, const uint8_t* kept, const std::vector<double>& Hd, int64_t K,
                              bool use_lapack) {
  std::vector<int64_t> I, Z;
  for (int64_t j = 0; j < K; ++j) (kept[j] ? I : Z).push_back(j);
  if (I.empty() || Z.empty()) {
    for (int64_t j : Z) w[j] = 0.0;
    return true;
  }
  std::vector<double> b = sub_matvec(Hd, K, I, Z, w);  // H̃_IZ w_Z
  std::vector<double> A = sub_matrix(Hd, K, I);
  if (!solve_spd(A, static_cast<int64_t>(I.size()), b, use_lapack)) return false;
  for (size_t a = 0; a < I.size(); ++a) w[I[a]] += b[a];
  for (int64_t j : Z) w[j] = 0.0;
  return true;
}

bool obr_quant_compensate_row(double* w, const uint8_t* kept, const double* e, int64_t split,
                              const std::vector<double>& Hd, int64_t K, bool use_lapack) {
  std::vector<int64_t> I1, I2;
  for (int64_t j = 0; j < K; ++j)
    if (kept[j]) (j < split ? I1 : I2).push_back(j);
  if (I1.empty() || I2.empty()) return true;
  std::vector<double> b = sub_matvec(Hd, K, I2, I1, e);  // H̃_I₂I₁ e₁
  std::vector<double> A = sub_matrix(Hd, K, I2);
  if (!solve_spd(A, static_cast<int64_t>(I2.size()), b, use_lapack)) return false;
  for (size_t a = 0; a < I2.size(); ++a) w[I2[a]] += b[a];
  return true;
}

ObrResult obr(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale, const ObrOptions& opt,
              const SgptqOptions& sg, const std::string& name) {
  return run(W, N, K, H, global_scale, opt, sg, name, /*use_lapack=*/true);
}

ObrResult obr_ref(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale, const ObrOptions& opt,
                  const SgptqOptions& sg, const std::string& name) {
  return run(W, N, K, H, global_scale, opt, sg, name, /*use_lapack=*/false);
}

SolvedExpert obr_expert(const model::ExpertWeights& w, int64_t H, int64_t I, const float* X, int64_t n, float gs_gu,
                        float gs_d, const ObrOptions& opt, const SgptqOptions& sg, const std::string (&names)[3],
                        const model::ExpertVariant& variant) {
  const Hessian Hx = accumulate_hessian(X, n, H);
  ObrResult rg = obr(w.gate.data(), I, H, Hx, gs_gu, opt, sg, names[0]);
  ObrResult ru = obr(w.up.data(), I, H, Hx, gs_gu, opt, sg, names[1]);
  std::vector<float> gq(static_cast<size_t>(I * H)), uq(static_cast<size_t>(I * H)), inter;
  format::sparse48_dequantize(rg.packed, gq.data());
  format::sparse48_dequantize(ru.packed, uq.data());
  if (n > 0) model::swiglu_forward(gq.data(), uq.data(), w.down.data(), H, I, X, n, 0, &inter, variant);
  const Hessian Hz = accumulate_hessian(inter.data(), n, I);
  ObrResult rd = obr(w.down.data(), H, I, Hz, gs_d, opt, sg, names[2]);
  SolvedExpert s;
  for (const ObrResult* r : {&rg, &ru, &rd})
    if (r->fallback && !s.fallback) s.fallback = true, s.note = r->fallback_reason;
  const int64_t unc = rg.rows_uncompensated + ru.rows_uncompensated + rd.rows_uncompensated;
  if (unc > 0)
    s.note += std::string(s.note.empty() ? "" : "; ") + std::to_string(unc) +
              " rows kept uncompensated (kept-set Hessian not PD)";
  s.packed.proj[0] = std::move(rg.packed);
  s.packed.proj[1] = std::move(ru.packed);
  s.packed.proj[2] = std::move(rd.packed);
  return s;
}

}  // namespace moesq::compress
