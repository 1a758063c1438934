// Layer-wise Hessians for one-shot compression (GPTQ/SparseGPT, paper §3.4, DESIGN.md §5), and the
// fp64 dense linear algebra the solvers need on them (Cholesky, the inverse-Hessian factor).
//
// For a linear layer y = W x with calibration rows X [n, K], the reconstruction loss
// ‖(W − Ŵ) Xᵀ‖² has the Hessian  H = 2 XᵀX / n  (with respect to one output row of W).
// Non-obvious decision: H is accumulated in fp64 from fp32 rows (cblas_dsyrk on a widened copy),
// because the solver inverts it and fp32 XᵀX on thousands of correlated rows loses the small
// eigenvalues that the inverse depends on.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace moesq::compress {

// H = 2 XᵀX / n over the n calibration rows seen so far (n may be 0: then H is all zeros).
struct Hessian {
  int64_t K = 0;          // input features (contraction dim of the layer)
  int64_t n = 0;          // calibration rows accumulated
  std::vector<double> H;  // [K, K] symmetric, row-major, both triangles filled
};

// H over X [n, K] fp32 row-major. n may be 0 (then X may be null).
// row_weights [n] (optional, >= 0): H = 2 Σ_t w_t x_t x_tᵀ / n — e.g. router weights of the
// tokens routed to an expert; null means all 1.
Hessian accumulate_hessian(const float* X, int64_t n, int64_t K, const float* row_weights = nullptr);
// Plain-loop twin of accumulate_hessian (same result up to fp64 summation order).
Hessian accumulate_hessian_ref(const float* X, int64_t n, int64_t K,
                               const float* row_weights = nullptr);
// Adds n more rows to h (running mean, as GPTQ's add_batch): afterwards h equals
// accumulate_hessian over all rows seen. h.K must equal K (or h be empty: K = 0, n = 0).
void hessian_add_rows(Hessian& h, const float* X, int64_t n, int64_t K,
                      const float* row_weights = nullptr);

// In-place Cholesky A = L Lᵀ of a symmetric [K, K] fp64 matrix (lower triangle read; on success
// the lower triangle holds L and the strict upper triangle is zeroed). Returns false (A then
// unspecified) when a pivot L_jj² is not finite or not above min_pivot: the matrix is not
// numerically PD.
// Fast path: LAPACK dpotrf (OpenBLAS); _ref: plain loops (Cholesky–Banachiewicz).
bool cholesky_lower(std::vector<double>& A, int64_t K, double min_pivot = 0.0);
bool cholesky_lower_ref(std::vector<double>& A, int64_t K, double min_pivot = 0.0);

// Pivots below this fraction of max(diag H) count as a failed factorisation: a singular PSD
// Hessian (n < K rows, no damping) otherwise "succeeds" with pivots at rounding level (~1e-16
// relative) and an inverse of size 1e16 that blows the GPTQ updates up. 1e-10 still admits
// condition numbers up to 1e10; any damping percdamp >= 1e-9 clears it by construction.
constexpr double kMinPivotRel = 1e-10;

// The factor GPTQ propagates errors with: the UPPER Cholesky factor U of H⁻¹ (H⁻¹ = Uᵀ U), [K, K]
// row-major, zero below the diagonal. H must be symmetric PD; returns false when the
// factorisation fails (pivot <= kMinPivotRel · max diag H, or non-finite; the caller falls back). Row i of U, scaled by 1/U_ii, is the update that
// the rounding error of column i applies to columns j > i (GPTQ Eq. for δ_F).
// Fast path: dpotrf + dtrtri; _ref: the plain-loop Cholesky and forward substitution.
bool inverse_cholesky_upper(const std::vector<double>& H, int64_t K, std::vector<double>& U);
bool inverse_cholesky_upper_ref(const std::vector<double>& H, int64_t K, std::vector<double>& U);

}  // namespace moesq::compress
