// JSQ, the joint sparsification-quantization baseline of paper 002's Table 1 (Guo et al., ICML 2024,
// "Compressing Large Language Models by Joint Sparsification and Quantization"), adapted to paired
// 4:8 NVFP4 MoE experts as paper 002 Appendix B describes for its baselines.
//
// Per projection W [N, K] with layer input X [n, K] (the expert's routed calibration rows):
//   1. activation editing (JSQ §3.3): for the STATISTICS only, the largest-|x| entries of X are
//      clamped: k = floor(clip_high · n·K), every |x| above the k-th largest |x| is clamped to it;
//   2. score S = |W| · ‖X_j‖₂ (Wanda term) + ρ · ss, with the quantization-range salience
//      ss[o, i] = max_t y'_{t,o} − min_t y'_{t,o},  y' = X Wᵀ with column i of W zeroed
//      (JSQ's range salience, the reference code's generate_ss: zeroing weight (o, i) changes the
//      range of output o that per-token activation quantization must cover); an infinite ss
//      becomes 100 (reference code);
//   3. support: per group of 8, keep the 2 pairs of largest summed score (compress/pair_scores.h);
//   4. quantization: round-to-nearest paired 4:8 NVFP4 of the kept weights (format::sparse48_quantize).
// Adaptation decisions (what paper 002 says it adapted, made concrete here):
//   - SmoothQuant smoothing (JSQ's step between pruning and quantization) is NOT applied: its
//     per-channel factors would have to be folded into the post-attention RMSNorm, which the router
//     and every expert of the layer share, and the checkpoint format has no per-channel activation
//     scale (the same reason paper 002 drops OBR's rotation);
//   - the statistics of all three projections come from ONE pass of the original (dense) expert over
//     its rows, as the reference prunes a whole decoder layer from one dense forward; down_proj's
//     input is therefore the dense SwiGLU output silu(X Gᵀ) ⊙ (X Uᵀ);
//   - ss is computed on MEAN rows: means of consecutive blocks of rows_per_mean = 128 clipped rows.
//     The reference computes ss on the position-wise mean of its 128 calibration sequences (2,048
//     mean rows), not on tokens; an expert's rows are tokens of many sequences and positions, so
//     blocks of 128 of them are averaged instead: the same averaging factor, hence ss on the same
//     scale against the Wanda term as in the reference (measured here on raw rows, ρ = 2.1 let ss
//     dominate: relative output error 0.98 against 0.36 for ρ = 0 and 0.40 for magnitude + RTN,
//     16 calibration sequences). An expert with < 256 rows has one mean row, ss = 0 (Wanda alone).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compress/packed_expert.h"
#include "format/nvfp4.h"
#include "model/decoder.h"

namespace moesq::compress {

struct JsqOptions {
  double rho = 2.1;            // weight of ss against the Wanda term (JSQ reference default --rho)
  double clip_high = 0.01;     // activation editing fraction (reference default --clip_h)
  int64_t rows_per_mean = 128;  // rows averaged into one ss row (reference: 128 sequences per position)
};

// Step 1 on X [n, K] fp32: a clamped copy (n·K·clip_high < 1 → unchanged). Error for clip_high
// outside [0, 1).
std::vector<float> clip_activations(const float* X, int64_t n, int64_t K, double clip_high);

// ss of step 2 over the rows X [n, K] for W [N, K]; returns [N, K] (n == 0 → zeros).
// Fast path: y = X Wᵀ once, then y_{t,o} − X[t,i]·W[o,i] for every i (a rank-1 correction).
std::vector<double> jsq_range_salience(const float* W, int64_t N, int64_t K, const float* X, int64_t n);
// Plain-loop twin in the reference's form: for every i, the full product with column i zeroed.
// O(n·N·K²): tests only.
std::vector<double> jsq_range_salience_ref(const float* W, int64_t N, int64_t K, const float* X, int64_t n);

// Step 2's score S [N, K] from the UNCLIPPED rows X [n, K] (clipping and row subsampling inside).
std::vector<double> jsq_scores(const float* W, int64_t N, int64_t K, const float* X, int64_t n,
                               const JsqOptions& opt);

struct JsqResult {
  std::vector<uint8_t> patterns;  // [N, K/8]
  format::Sparse48Tensor packed;  // RTN of W under `patterns`, tensor scale γ
  bool fallback = false;          // n == 0: magnitude patterns (format::magnitude_patterns)
  std::string fallback_reason;
};

// Steps 1–4 for one projection. W [N, K], K % 32 == 0; X [n, K] (n may be 0 → fallback);
// global_scale γ (<= 0 → Eq. 5 on the kept values). `name` names the tensor in errors.
JsqResult jsq(const float* W, int64_t N, int64_t K, const float* X, int64_t n, float global_scale,
              const JsqOptions& opt = {}, const std::string& name = "weight");

// One SwiGLU expert (gate/up [I, H], down [H, I]) on its rows X [n, H]: gate and up from X, down
// from the dense intermediate; γ_gu shared by gate and up, γ_d for down (DESIGN.md §3).
// names: the three tensor names for errors. variant: the expert's biases and activation (gpt-oss;
// model::expert_variant), so down's intermediate is the family's expert, not plain SwiGLU.
SolvedExpert jsq_expert(const model::ExpertWeights& w, int64_t H, int64_t I, const float* X, int64_t n, float gs_gu,
                        float gs_d, const JsqOptions& opt, const std::string (&names)[3],
                        const model::ExpertVariant& variant = {});

}  // namespace moesq::compress
