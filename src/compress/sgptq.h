// SGPTQ: SparseGPT support selection + GPTQ quantization with the support fixed, for the paired 4:8
// NVFP4 format (DESIGN.md §5; paper §3.4 and Appendix B; Frantar & Alistarh 2023, Frantar et al. 2023).
//
// Columns of W [N, K] are processed left to right with the upper Cholesky factor U of H⁻¹ (the
// damped Hessian). For column i with updated weights w = W[:, i] and d = U_ii:
//   support  at each 8-column group boundary, score every pair p of the group by
//            Σ_{j∈p} w_j² / d_j² (SparseGPT's saliency, on the CURRENT updated weights) and keep the
//            2 highest-scoring pairs (= prune the 2 lowest); ties → lower pattern id;
//   scale    at each 32-column scale block start, the block's UE4M3 code c = UE4M3(γ · amax / 6)
//            over the updated weights of the block at that moment, masked with PROVISIONAL
//            patterns of its 4 groups chosen by the same saliency (GPTQ with groups: a group's
//            scale is fixed when the group starts, before its columns are rounded);
//   rounding q = dec(E2M1(w·γ/dec(c))) · dec(c)/γ on kept rows, 0 on pruned rows;
//   update   W[:, j] −= (w − q)/d · U_ij for j > i (GPTQ's δ = −(w − q)/[H⁻¹]_ii · H⁻¹_{i,:},
//            through the Cholesky factor), lazily per block of `block_size` columns.
// Decision: the UE4M3 code must be known before the first column of its scale block is rounded,
// but SparseGPT fixes a group's support only when the group starts. The code is therefore taken
// from provisional supports, and groups 2–4 of the block may still change their support after
// further updates (the code is then kept; E2M1 saturates at 6 if a newly kept value is larger).
// The alternative — fixing all four supports at the scale-block start (pattern_at_group = false)
// — measured worse: relative calibration-output error 0.2548 vs 0.2539 (K=256) and 0.2682 vs
// 0.2647 (K=128), mean over 6 seeds, better on 18 of 18 layers (sgptq test layer generator).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compress/hessian.h"
#include "format/nvfp4.h"

namespace moesq::compress {

struct ExpertJob;
struct ExpertReport;
struct SgptqExpert;

struct SgptqOptions {
  double percdamp = 0.01;      // damping λ = percdamp · mean(diag H), added to diag H
  int64_t block_size = 128;    // GPTQ lazy-update block (columns); a multiple of 32
  int64_t min_tokens = 0;      // fewer calibration rows than this → identity-Hessian fallback
  bool pattern_at_group = true;  // SparseGPT per-group support choice (see header comment)
  // Where an expert's SGPTQ runs (methods/sgptq_expert.h): null = the CPU solver below; `compress
  // --device cuda` sets the GPU one (compress/sgptq_cuda.h). Not part of the options JSON: report.json
  // and the resume manifest record the device separately.
  SgptqExpert (*device)(const ExpertJob& job, const SgptqOptions& opt, ExpertReport& rep) = nullptr;
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
// the caller). It calls BLAS/LAPACK (dpotrf, dtrtri, dger, dgemm): when the caller runs experts on
// several threads, hold OpenBLAS at 1 thread meanwhile (openblas_set_num_threads(1)) — 128 tiny-model
// experts (2 Hessians + 3 solves each, n = 512) on 2 threads took 12.3–14.1 s with OpenBLAS's own
// threads and 2.7–6.3 s with OPENBLAS_NUM_THREADS=1 (shared 2-core machine, load average 8–10).
SgptqResult sgptq(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                  const SgptqOptions& opt = {}, const std::string& name = "weight");

// The input checks every SGPTQ solve runs first (Error naming `name`): shape, block size, percdamp,
// every weight finite.
void sgptq_check_weights(const float* W, int64_t N, int64_t K, const SgptqOptions& opt, const std::string& name);

// Packs a solve's codes into the paired 4:8 layout of format/nvfp4.h: patterns [N, K/8] ids, scale
// codes [N, K/32] UE4M3, value codes [N, K/2] one E2M1 code per byte (the kept values in group order).
format::Sparse48Tensor sgptq_pack(int64_t N, int64_t K, float gamma, const std::vector<uint8_t>& patterns,
                                  std::vector<uint8_t> scale_codes, const std::vector<uint8_t>& value_codes);

// Plain-loop twin: no lazy block updates (every column's error is applied to all later columns at
// once), no BLAS. Same result up to fp64 summation order.
SgptqResult sgptq_ref(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                      const SgptqOptions& opt = {}, const std::string& name = "weight");

// GPTQ with the support GIVEN (patterns [N, K/8], ids in [0, 6)): the same column loop, scale
// blocks and rounding as sgptq, no SparseGPT choice. Columns before gptq_from (0 <= gptq_from <= K)
// are rounded to nearest without propagating their error; from gptq_from on, each column's error
// updates the later columns (OBR's final step: RTN on the first α·K columns, GPTQ on the rest,
// compress/obr.h). gptq_from = 0 is plain GPTQ on a fixed support.
SgptqResult gptq_fixed_support(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                               const uint8_t* patterns, int64_t gptq_from, const SgptqOptions& opt = {},
                               const std::string& name = "weight");
// Plain-loop twin (no lazy blocks, no BLAS).
SgptqResult gptq_fixed_support_ref(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                                   const uint8_t* patterns, int64_t gptq_from, const SgptqOptions& opt = {},
                                   const std::string& name = "weight");

}  // namespace moesq::compress
