// moesq refinement of one routed expert (paper 002 §3.2–3.4, Algorithm 1 lines 7–18): starting from
// the SGPTQ solution, learn the paired 4:8 supports (Gumbel-softmax logits A) and the NVFP4 values
// (latent V, straight-through Q_w) of gate, up and down jointly, against the expert's own outputs
// under the router-weighted loss of Eq. 4 with W4A4 activation quantization inside the loop; Lion.
// Finish: argmax pattern per group, recompute the scales, pack.
//
// Non-obvious decisions:
//  * The curves and both final losses are measured on HELD-OUT cached tokens of the expert
//    (heldout_fraction of its rows, chosen from the seed), so the report shows generalization, not
//    the fit; with a single token there is nothing to hold out and the curves use the training row.
//  * Everything random (prior-init noise, Gumbel noise, shuffles, held-out split) is counter-based
//    on (seed, ExpertData::stream, step), so a run is bitwise reproducible from the seed whatever the
//    order in which the caller's threads pick experts up.
//  * refine_expert is single-threaded apart from BLAS: the caller runs the experts of a layer in
//    parallel (DESIGN.md §5). The per-step math lives in refine_expert_grad.h behind one function,
//    objective_grad, which is what a GPU version would replace.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/nvfp4.h"

namespace moesq::compress {

struct RefineOptions {
  int p = 2;              // router weighting of Eq. 4: row weight g^p (2 = moesq; 0 = uniform ablation)
  bool update_A = true;   // false: "V only" ablation, the support stays the prior (SGPTQ) one
  int epochs = 10;        // passes over the expert's training rows
  int64_t batch = 256;    // rows per optimizer step
  int64_t micro_batch = 64;  // rows per GEMM pass (gradients accumulated; bounds memory only)
  // Lion learning rates. Defaults: paper Table 4 (Qwen3-30B-A3B), tuned there for thousands of
  // steps per expert. Lion moves every parameter by ±lr per step, so a run of tens of steps needs
  // larger rates: on the tiny model (layer 0 and 3 experts, ~1300 rows each) the measured best
  // were lr_A = 1e-3, lr_V = 5e-4 for 2–10 epochs (issue 3 report has the sweep).
  double lr_A = 2.5e-4, lr_V = 5e-5;
  double beta1 = 0.9, beta2 = 0.95, weight_decay = 1.0;  // Lion (decoupled weight decay)
  double lr_final_frac = 0.1;         // cosine decay to this fraction of the initial lr
  double tau0 = 2.0, tau1 = 0.05;     // Gumbel temperature τ, linear over the steps
  double kappa0 = 100, kappa1 = 500;  // logit scale κ in softmax((κA + G)/τ), linear over the steps
  double sigma = 0.01, s = 4;         // prior init A = σ·(ε + s·(overlap − mean overlap))
  double heldout_fraction = 0.1;      // rows kept out of training for the curves and final losses
  uint64_t seed = 0;
  int act_block = format::kActScaleBlock;  // Q_a block (32 for paired 4:8 experts)
  // When the refined expert is worse on the held-out rows than the initial packed tensors (if the
  // caller gave them), return the initial ones (note says so). Off by default: the paper does not.
  bool keep_init_if_worse = false;
  // Experts with fewer calibration rows than this are not refined (treated like an expert without
  // rows: the initial solution is returned, skipped = true, the note says why). 0: refine all.
  int64_t min_rows = 0;
};

// The cached calibration data of one expert (paper §3.4): inputs, router weights, dense targets.
struct ExpertData {
  int64_t n = 0, H = 0, I = 0;  // rows routed to the expert, hidden size, intermediate size
  const float* X = nullptr;     // [n, H] expert inputs (before activation quantization)
  const float* g = nullptr;     // [n] router combine weights of the rows for this expert
  const float* Y_ref = nullptr; // [n, H] outputs of the ORIGINAL expert on X
  uint64_t stream = 0;          // RNG stream of this expert, e.g. layer · num_experts + expert
};

// Initial solution of one projection W [N, K] (gate/up [I, H], down [H, I]).
struct ProjInit {
  const float* V0 = nullptr;       // [N, K] initial latent weights: SGPTQ dense_rounded
  const uint8_t* prior = nullptr;  // [N, K/8] initial patterns: SGPTQ patterns
  float global_scale = 0.0f;       // γ of `packed` below; informational when packed is given
  // The initial packed tensor (SGPTQ's), optional: returned unchanged for an expert without rows
  // (and with keep_init_if_worse), and evaluated for init_hard_loss. Null: V0/prior re-packed.
  const format::Sparse48Tensor* packed = nullptr;
};

struct RefineCurves {
  // Per epoch, on the held-out rows: "soft" = noise-free relaxed support softmax(κA/τ) at the
  // epoch's last τ, κ (with Q_w, Q_a); "hard" = argmax support, recomputed scales (= what is packed).
  std::vector<double> soft_loss, hard_loss;
  std::vector<double> epoch_seconds;  // wall time of each epoch's optimizer steps
};

struct RefineResult {
  format::Sparse48Tensor gate, up, down;  // gate/up share one global scale (DESIGN.md §3)
  RefineCurves curves;
  double init_hard_loss = 0.0;   // held-out Eq. 4 loss of the initial packed solution
  double final_hard_loss = 0.0;  // held-out Eq. 4 loss of the returned tensors (from their bits)
  int64_t train_rows = 0, heldout_rows = 0, steps = 0;
  double pattern_change = 0.0;   // fraction of groups whose pattern differs from the prior
  double seconds = 0.0;          // wall time of refine_expert
  bool skipped = false;          // no (or < min_rows) calibration rows: the initial solution is returned
  std::string note;              // human-readable reason for skips/fallbacks ("" when none)
};

// Every refinement option in range (moesq::Error naming the option otherwise). refine_expert calls it
// too, but callers validate once up front (compress::validate) so a bad value fails before any work.
void validate(const RefineOptions& o);

// Options ↔ JSON (the report's "refine_options"; the options themselves travel typed). Keys are the
// field names above; missing keys keep their defaults; an unknown key or a wrong type is an Error
// naming the key (a typo must not silently fall back to a default).
RefineOptions refine_options_from_json(const nlohmann::json& j);
nlohmann::json refine_options_to_json(const RefineOptions& o);

// Refines one expert. Shapes: gate/up V0 [I, H], down V0 [H, I]; H and I multiples of 32.
// Errors (moesq::Error) name the option or the tensor at fault.
RefineResult refine_expert(const ExpertData& data, const ProjInit& gate, const ProjInit& up,
                           const ProjInit& down, const RefineOptions& opt);

}  // namespace moesq::compress
