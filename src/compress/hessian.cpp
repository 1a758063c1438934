// Hessian accumulation (H = 2 XᵀX / n, fp64) and the Cholesky factors GPTQ needs.
// Non-obvious decision: the upper Cholesky factor of H⁻¹ is computed WITHOUT forming H⁻¹: with J the
// index reversal, chol(J H J) = M gives H = R Rᵀ with R = J M J upper triangular, hence
// H⁻¹ = (R⁻¹)ᵀ R⁻¹ and U = R⁻¹ = J M⁻¹ J. One Cholesky and one triangular inverse instead of
// GPTQ's Cholesky → inverse → Cholesky, and no explicitly formed (and re-rounded) inverse.
// Fast paths call BLAS/LAPACK (dsyrk, dpotrf, dtrtri); every one has a plain-loop _ref twin.
#include "compress/hessian.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

// LAPACK (Fortran ABI, provided by OpenBLAS, which the build links as BLAS): Cholesky and
// triangular inverse. Declared here because Debian's OpenBLAS ships no LAPACKE header.
extern "C" {
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dtrtri_(const char* uplo, const char* diag, const int* n, double* a, const int* lda, int* info);
}

namespace moesq::compress {

namespace {

// Rows widened to fp64 per chunk: bounds the temporary at kChunkRows·K doubles.
constexpr int64_t kChunkRows = 4096;

void check_rows(const float* X, int64_t n, int64_t K, const float* row_weights) {
  MOESQ_CHECK(K > 0, "accumulate_hessian: K must be positive, got K=", K);
  MOESQ_CHECK(n >= 0, "accumulate_hessian: negative row count n=", n);
  MOESQ_CHECK(n == 0 || X != nullptr, "accumulate_hessian: X is null with n=", n);
  if (row_weights)
    for (int64_t t = 0; t < n; ++t)
      MOESQ_CHECK(row_weights[t] >= 0.0f && std::isfinite(row_weights[t]),
                  "accumulate_hessian: row weight ", t, " is ", row_weights[t],
                  " (must be finite and >= 0)");
}

void mirror_upper_to_lower(std::vector<double>& H, int64_t K) {
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < i; ++j) H[i * K + j] = H[j * K + i];
}

}  // namespace

void hessian_add_rows(Hessian& h, const float* X, int64_t n, int64_t K, const float* row_weights) {
  check_rows(X, n, K, row_weights);
  if (h.K == 0 && h.n == 0) {
    h.K = K;
    h.H.assign(static_cast<size_t>(K * K), 0.0);
  }
  MOESQ_CHECK(h.K == K, "hessian_add_rows: Hessian has K=", h.K, " but the rows have K=", K);
  if (n == 0) return;
  const int64_t n_total = h.n + n;
  // Running mean: H_old = 2 S_old / n_old  →  H_new = H_old · n_old/n_total + 2 XᵀX / n_total.
  const double keep = static_cast<double>(h.n) / static_cast<double>(n_total);
  for (double& v : h.H) v *= keep;
  const double alpha = 2.0 / static_cast<double>(n_total);
  std::vector<double> A;  // [rows, K] fp64 chunk of X (scaled by sqrt(w_t) when weighted)
  for (int64_t t0 = 0; t0 < n; t0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, n - t0);
    A.resize(static_cast<size_t>(rows * K));
    for (int64_t t = 0; t < rows; ++t) {
      const double s = row_weights ? std::sqrt(static_cast<double>(row_weights[t0 + t])) : 1.0;
      const float* x = X + (t0 + t) * K;
      double* a = A.data() + t * K;
      for (int64_t k = 0; k < K; ++k) a[k] = s * static_cast<double>(x[k]);
    }
    // Upper triangle of H += alpha · Aᵀ A.
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(K), static_cast<int>(rows),
                alpha, A.data(), static_cast<int>(K), 1.0, h.H.data(), static_cast<int>(K));
  }
  mirror_upper_to_lower(h.H, K);
  h.n = n_total;
}

Hessian accumulate_hessian(const float* X, int64_t n, int64_t K, const float* row_weights) {
  Hessian h;
  h.K = K;
  h.H.assign(static_cast<size_t>(K * K), 0.0);
  hessian_add_rows(h, X, n, K, row_weights);
  return h;
}

Hessian accumulate_hessian_ref(const float* X, int64_t n, int64_t K, const float* row_weights) {
  check_rows(X, n, K, row_weights);
  Hessian h;
  h.K = K;
  h.n = n;
  h.H.assign(static_cast<size_t>(K * K), 0.0);
  if (n == 0) return h;
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) {
      double s = 0.0;
      for (int64_t t = 0; t < n; ++t) {
        const double w = row_weights ? static_cast<double>(row_weights[t]) : 1.0;
        s += w * static_cast<double>(X[t * K + i]) * static_cast<double>(X[t * K + j]);
      }
      h.H[i * K + j] = 2.0 * s / static_cast<double>(n);
    }
  return h;
}

namespace {

void check_square(const std::vector<double>& A, int64_t K, const char* what) {
  MOESQ_CHECK(K > 0 && static_cast<int64_t>(A.size()) == K * K, what, ": matrix has ", A.size(),
              " entries, expected K*K with K=", K);
}

// Pivot test shared by both paths: the squared diagonal of L against min_pivot, and finiteness.
bool pivots_ok(const std::vector<double>& L, int64_t K, double min_pivot) {
  for (int64_t j = 0; j < K; ++j) {
    const double d = L[j * K + j];
    if (!std::isfinite(d) || !(d > 0.0) || !(d * d > min_pivot)) return false;
  }
  return true;
}

// J H J: the index reversal of inverse_cholesky_upper (see the file header).
std::vector<double> reversed(const std::vector<double>& H, int64_t K) {
  std::vector<double> M(static_cast<size_t>(K * K));
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < K; ++j) M[i * K + j] = H[(K - 1 - i) * K + (K - 1 - j)];
  return M;
}

double max_diag(const std::vector<double>& H, int64_t K) {
  double m = 0.0;
  for (int64_t k = 0; k < K; ++k) m = std::max(m, H[k * K + k]);
  return m;
}

// U = J Minv J (upper), from the lower triangle of Minv; false on a non-finite entry.
bool unreverse_upper(const std::vector<double>& Minv, int64_t K, std::vector<double>& U) {
  U.assign(static_cast<size_t>(K * K), 0.0);
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = i; j < K; ++j) {
      const double v = Minv[(K - 1 - i) * K + (K - 1 - j)];
      if (!std::isfinite(v)) return false;
      U[i * K + j] = v;
    }
  return true;
}

}  // namespace

bool cholesky_lower(std::vector<double>& A, int64_t K, double min_pivot) {
  check_square(A, K, "cholesky_lower");
  // Row-major lower L = column-major upper: dpotrf('U') on the same memory computes it.
  const char uplo = 'U';
  const int k = static_cast<int>(K);
  int info = 0;
  dpotrf_(&uplo, &k, A.data(), &k, &info);
  if (info != 0) return false;
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = i + 1; j < K; ++j) A[i * K + j] = 0.0;
  return pivots_ok(A, K, min_pivot);
}

bool cholesky_lower_ref(std::vector<double>& A, int64_t K, double min_pivot) {
  check_square(A, K, "cholesky_lower_ref");
  // Row-oriented (Cholesky–Banachiewicz): L_ij = (A_ij − L_i,<j · L_j,<j) / L_jj; contiguous dots.
  for (int64_t i = 0; i < K; ++i) {
    double* Li = A.data() + i * K;
    for (int64_t j = 0; j <= i; ++j) {
      const double* Lj = A.data() + j * K;
      double s = Li[j];
      for (int64_t k = 0; k < j; ++k) s -= Li[k] * Lj[k];
      if (j == i) {
        if (!(s > min_pivot) || !(s > 0.0) || !std::isfinite(s)) return false;
        Li[i] = std::sqrt(s);
      } else {
        Li[j] = s / Lj[j];
      }
    }
    for (int64_t j = i + 1; j < K; ++j) Li[j] = 0.0;
  }
  return pivots_ok(A, K, min_pivot);
}

bool inverse_cholesky_upper(const std::vector<double>& H, int64_t K, std::vector<double>& U) {
  check_square(H, K, "inverse_cholesky_upper");
  std::vector<double> M = reversed(H, K);  // → chol(J H J), lower
  if (!cholesky_lower(M, K, kMinPivotRel * max_diag(H, K))) return false;
  // M⁻¹ in place: row-major lower = column-major upper → dtrtri('U', non-unit).
  const char uplo = 'U', diag = 'N';
  const int k = static_cast<int>(K);
  int info = 0;
  dtrtri_(&uplo, &diag, &k, M.data(), &k, &info);
  if (info != 0) return false;
  return unreverse_upper(M, K, U);
}

bool inverse_cholesky_upper_ref(const std::vector<double>& H, int64_t K, std::vector<double>& U) {
  check_square(H, K, "inverse_cholesky_upper_ref");
  std::vector<double> M = reversed(H, K);
  if (!cholesky_lower_ref(M, K, kMinPivotRel * max_diag(H, K))) return false;
  // Minv = M⁻¹ (lower) by forward substitution on rows: row_i = (e_i − Σ_{k<i} M_ik row_k) / M_ii.
  std::vector<double> Minv(static_cast<size_t>(K * K), 0.0);
  for (int64_t i = 0; i < K; ++i) {
    double* ri = Minv.data() + i * K;
    const double* mi = M.data() + i * K;
    ri[i] = 1.0;
    for (int64_t k = 0; k < i; ++k) {
      const double f = mi[k];
      const double* rk = Minv.data() + k * K;
      for (int64_t j = 0; j <= k; ++j) ri[j] -= f * rk[j];
    }
    const double inv = 1.0 / mi[i];
    for (int64_t j = 0; j <= i; ++j) ri[j] *= inv;
  }
  return unreverse_upper(Minv, K, U);
}

}  // namespace moesq::compress
