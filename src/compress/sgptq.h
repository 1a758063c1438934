// SGPTQ: SparseGPT support selection + GPTQ quantization with the support fixed, for the paired 4:8
// NVFP4 format (DESIGN.md §5; paper §3.4 and Appendix B; Frantar & Alistarh 2023, Frantar et al. 2023).
//
// Columns of W [N, K] are processed left to right with the upper Cholesky factor U of H⁻¹ (the
// damped Hessian). For column i with updated weights w = W[:, i] and d = U_ii:
//   support  at each 32-column scale block start, for each of its four 8-column groups, score every
//            pair p by Σ_{j∈p} w_j² / d_j² (SparseGPT's saliency, on the CURRENT updated weights),
//            keep the 2 highest-scoring pairs (= prune the 2 lowest), ties → lower pattern id;
//   scale    the block's UE4M3 code c = UE4M3(γ · amax / 6) over the updated, masked weights of
//            the 32-column block at that moment (GPTQ with groups: the scale is fixed when its
//            group starts);
//   rounding q = dec(E2M1(w·γ/dec(c))) · dec(c)/γ on kept rows, 0 on pruned rows;
//   update   W[:, j] −= (w − q)/d · U_ij for j > i (GPTQ's δ = −(w − q)/[H⁻¹]_ii · H⁻¹_{i,:},
//            through the Cholesky factor), lazily per block of `block_size` columns.
// Why the four patterns of a scale block are chosen together at its start and not each at its own
// 8-column boundary: the UE4M3 code depends on which values are kept, and it must be known before
// the block's first column is rounded. Choosing the patterns of a scale block together costs at
// most 24 columns of "look-ahead" on not-yet-updated weights; choosing them later would round the
// first columns with a scale computed from a support that may then change. (The option
// `pattern_at_group = true` does the SparseGPT per-group choice with a provisional scale instead;
// the test suite compares both, the default is the better one measured there.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compress/hessian.h"
#include "format/nvfp4.h"

namespace moesq::compress {

struct SgptqOptions {
  double percdamp = 0.01;      // damping λ = percdamp · mean(diag H), added to diag H
  int64_t block_size = 128;    // GPTQ lazy-update block (columns); a multiple of 32
  int64_t min_tokens = 0;      // fewer calibration rows than this → identity-Hessian fallback
  bool pattern_at_group = false;  // see header comment
};

struct SgptqResult {
  std::vector<uint8_t> patterns;     // [N, K/8] pattern ids in [0, 6)
  // [N, K] fp32. Kept positions: the dequantized value (bit-equal to sparse48_dequantize(packed):
  // same fp32 evaluation order as format/nvfp4.cpp). Pruned positions: the GPTQ-updated weight at
  // the moment its column was processed (unmasked, unrounded). The refinement's initial latent V.
  std::vector<float> dense_rounded;
  format::Sparse48Tensor packed;     // the final paired 4:8 NVFP4 tensor (global scale γ)
  bool fallback = false;             // true: identity Hessian (= magnitude patterns + RTN)
  std::string fallback_reason;       // e.g. "no calibration tokens: identity Hessian"
  int64_t dead_columns = 0;          // inputs with diag H == 0: H_ii := 1 and W[:, i] := 0
  double gptq_loss = 0.0;            // Σ_i ‖w_i − q_i‖² / (2 d_i²): GPTQ's proxy loss (H-weighted)
};

// W: [N, K] fp32 row-major (PyTorch Linear layout), K % 32 == 0. H: Hessian over the layer's
// inputs (H.K == K; H.n == 0 allowed). global_scale γ (Eq. 5); <= 0 → nvfp4_tensor_scale(amax W).
// `name` names the tensor in error messages. Thread-safe (pure; experts are solved in parallel by
// the caller); single-threaded except for BLAS on large blocks.
SgptqResult sgptq(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                  const SgptqOptions& opt = {}, const std::string& name = "weight");

// Plain-loop twin: no lazy block updates (every column's error is applied to all later columns at
// once), no BLAS. Same result up to fp64 summation order.
SgptqResult sgptq_ref(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                      const SgptqOptions& opt = {}, const std::string& name = "weight");

}  // namespace moesq::compress
