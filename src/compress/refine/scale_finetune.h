// Scale-only fine-tuning of one refined routed expert (issue 29): the GSQ stage (arXiv 2604.18556
// App. H) that the paper's reference implementation runs after the refinement. Everything discrete
// is frozen — each kept weight's E2M1 value q and the paired 4:8 patterns — and only the UE4M3 block
// scales move: one log-multiplier θ_b per 32-element block, s_b = s0_b · exp(θ_b), where s0_b =
// dec(c_b) / γ is the block's scale as packed. The forward projects the scales onto what NVFP4 stores,
//   γ' = min(γ, 448 / max_b s_b)    (over gate ∪ up, which share one γ; down alone),
//   c'_b = UE4M3(clamp(s_b · γ', 2^-9, 448)),   Ŵ = e2m1(q) · dec(c'_b) / γ'   (format::dequant order),
// so the loss sees exactly what is packed; the backward is straight-through: ∂Ŵ_j/∂s_b = e2m1(q_j),
// ∂L/∂θ_b = s_b · Σ_{j ∈ b} ∂L/∂Ŵ_j · e2m1(q_j), with ∂L/∂Ŵ from the refinement's own router-weighted
// objective (Eq. 4, Q_a on both expert inputs: objective.h expert_grad). Lion on θ (no weight decay),
// cosine-decayed rate.
//
// Non-obvious decision: γ is kept unless a block scale would pass UE4M3's 448 (then lowered so that the
// largest one is 448), where the reference re-derives γ = 448 / max s at every step. With moesq's rule
// θ = 0 reproduces the packed tensor bit for bit even when no kept block reaches code 448 (the Eq. 5 γ
// is taken over latent values that may be pruned), so the stage starts exactly where the refinement
// ended and the caller's held-out comparison (keep the better) is between the two packed experts.
#pragma once
#include <cstdint>
#include <vector>

#include "compress/refine/objective.h"
#include "format/nvfp4.h"
#include "model/decoder.h"

namespace moesq::compress::refine {

struct ScaleFinetuneOptions {
  int epochs = 0;              // passes over the training rows; 0: off
  int64_t batch = 64;          // rows per Lion step
  int64_t micro_batch = 64;    // rows per GEMM pass (bounds memory only)
  double lr = 1e-3;            // Lion step on θ: ±0.1 % relative change of a block scale per step
  double lr_final_frac = 0.1;  // cosine decay to this fraction
  double beta1 = 0.9, beta2 = 0.99;
};

// The rows the stage steps on (host memory).
struct ScaleFinetuneRows {
  int64_t n = 0, H = 0, I = 0;
  const float* Xq = nullptr;     // [n, H] expert inputs, already activation-quantized (Q_a)
  const float* Y_ref = nullptr;  // [n, H] the original expert's outputs
  const float* w = nullptr;      // [n] router row weights g^p
  int act_block = 32;            // Q_a block of the SwiGLU output
  model::ExpertVariant variant;  // gpt-oss biases / clamped SwiGLU
};

// Fine-tunes the block scales of gate, up and down (gate/up sharing one γ, as packed) on the rows
// `train` (ids into `rows`), shuffled per epoch from `shuffle_key`; replaces the three tensors' scales
// and global scales (values and patterns untouched). Returns the Lion steps taken. Errors: shapes that
// disagree with `rows`, gate and up with different γ, a non-finite loss.
int64_t scale_finetune(format::Sparse48Tensor& gate, format::Sparse48Tensor& up, format::Sparse48Tensor& down,
                       const ScaleFinetuneRows& rows, const std::vector<int64_t>& train, uint64_t shuffle_key,
                       const ScaleFinetuneOptions& o);

// The projection above on n block scales s (real units; 0 = an empty block) sharing the stored γ:
// writes their UE4M3 codes, returns γ'. Exposed for tests.
float project_block_scales(const float* s, int64_t n, float gamma, uint8_t* codes);

}  // namespace moesq::compress::refine
