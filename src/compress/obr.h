// OBR, the second joint sparse-quantization baseline of paper 002's Table 1 (Guo et al. 2026,
// "Optimal Brain Restoration for Joint Quantization and Sparsification of LLMs"), in the executable
// adaptation paper 002 Appendix B evaluates: the rotation step is omitted (rotated experts cannot run
// on the grouped sparse GEMM path), the target is paired 4:8 NVFP4.
//
// Per projection W [N, K] with Hessian H = 2 XᵀX / n (compress/hessian.h), damped H̃ = H + λI,
// λ = percdamp · mean(diag H) (dead inputs: H_jj := 1, W[:, j] := 0, as GPTQ):
//   1. mask: Wanda score |W_ij| · ‖X_j‖₂ (‖X_j‖₂² = H_jj / 2), 2 pairs of largest summed score kept
//      per group of 8 (compress/pair_scores.h); per row r, kept set I, pruned set Z;
//   2. sparsity compensation (OBR's pruning-error restoration, the OBS closed form restricted to the
//      kept set): minimise ‖(w' − w) X‖² over w'_I with w'_Z = 0:
//          δ_I = H̃_II⁻¹ H̃_IZ w_Z,     w'_I = w_I + δ_I;
//   3. quantization compensation (OBR's group error compensation): split I at column s = α·K
//      (rounded to a 32-column scale block) into I₁ (< s) and I₂ (>= s); e₁ = w'_I₁ − Q(w')_I₁
//      with Q the paired 4:8 NVFP4 RTN of the row; minimise the output error with I₁ fixed at Q:
//          δ₂ = H̃_I₂I₂⁻¹ H̃_I₂I₁ e₁,   w'_I₂ += δ₂;
//   4. final quantization: RTN on columns < s, GPTQ with the support of step 1 on columns >= s
//      (gptq_fixed_support, compress/sgptq.h; the reference's obr_gptq_quantization); `rtn` = RTN on
//      every column (the reference's --obr_rtn).
// A row whose H̃_II (or H̃_I₂I₂) is not numerically PD keeps the uncompensated weights (counted).
// No calibration rows (n == 0) or a non-finite Hessian: magnitude patterns + RTN (fallback).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compress/hessian.h"
#include "compress/packed_expert.h"
#include "compress/sgptq.h"
#include "format/nvfp4.h"
#include "model/decoder.h"

namespace moesq::compress {

struct ObrOptions {
  double alpha = 0.5;  // fraction of the columns rounded first (reference --obr_alpha)
  bool rtn = false;    // RTN on all columns after the compensations (reference --obr_rtn)
};

// Step 2 for one row. w: [K] fp64, updated in place (pruned entries set to 0); kept: [K] 0/1;
// Hd: the damped Hessian [K, K]. Returns false (w then unchanged) when H̃_II is not PD.
bool obr_prune_compensate_row(double* w, const uint8_t* kept, const std::vector<double>& Hd, int64_t K,
                              bool use_lapack = true);
// Step 3 for one row: e [K] holds e₁ on the kept columns < split (other entries ignored); adds δ₂ to
// the kept columns >= split of w [K]. Returns false (w unchanged) when H̃_I₂I₂ is not PD.
bool obr_quant_compensate_row(double* w, const uint8_t* kept, const double* e, int64_t split,
                              const std::vector<double>& Hd, int64_t K, bool use_lapack = true);

struct ObrResult {
  std::vector<uint8_t> patterns;    // [N, K/8]
  format::Sparse48Tensor packed;    // the final paired 4:8 NVFP4 tensor (tensor scale γ)
  std::vector<float> compensated;   // [N, K] W' after steps 2–3 (zeros where pruned), before step 4
  int64_t split = 0;                // s: first column of the GPTQ part
  int64_t rows_uncompensated = 0;   // rows whose step 2 or 3 failed (not PD)
  bool fallback = false;
  std::string fallback_reason;
};

// Steps 1–4. W [N, K] fp32, K % 32 == 0; H over the layer inputs (H.n == 0 → fallback); γ <= 0 →
// Eq. 5 on amax(W). sg: percdamp and GPTQ block size (the SGPTQ options). Error for α outside [0, 1],
// a shape mismatch or a non-finite weight, naming `name`.
ObrResult obr(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale, const ObrOptions& opt = {},
              const SgptqOptions& sg = {}, const std::string& name = "weight");
// Plain-loop twin: Cholesky–Banachiewicz instead of dpotrf, gptq_fixed_support_ref.
ObrResult obr_ref(const float* W, int64_t N, int64_t K, const Hessian& H, float global_scale,
                  const ObrOptions& opt = {}, const SgptqOptions& sg = {}, const std::string& name = "weight");

// One SwiGLU expert on its rows X [n, H] (gate/up [I, H], down [H, I]): gate and up from the Hessian
// of X, down from the Hessian of ITS inputs as produced by the compressed gate/up (the reference
// compresses [up, gate] and then re-runs the layer before down). γ_gu shared by gate and up. variant:
// the expert's biases and activation (gpt-oss; model::expert_variant) in that re-run.
SolvedExpert obr_expert(const model::ExpertWeights& w, int64_t H, int64_t I, const float* X, int64_t n, float gs_gu,
                        float gs_d, const ObrOptions& opt, const SgptqOptions& sg, const std::string (&names)[3],
                        const model::ExpertVariant& variant = {});

}  // namespace moesq::compress
