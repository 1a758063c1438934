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
//    parallel (DESIGN.md §5). The per-step math lives in refine/objective.h behind one function,
//    objective_grad, which is what a GPU version would replace.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compress/refine/options.h"
#include "format/nvfp4.h"
#include "model/decoder.h"

namespace moesq::compress {

// The cached calibration data of one expert (paper §3.4): inputs, router weights, dense targets.
struct ExpertData {
  int64_t n = 0, H = 0, I = 0;  // rows routed to the expert, hidden size, intermediate size
  const float* X = nullptr;     // [n, H] expert inputs (before activation quantization)
  const float* g = nullptr;     // [n] router combine weights of the rows for this expert
  const float* Y_ref = nullptr; // [n, H] outputs of the ORIGINAL expert on X
  uint64_t stream = 0;          // RNG stream of this expert, e.g. layer · num_experts + expert
  // Training rows the schedule rule is applied to when RefineOptions::rule_per_expert is false
  // (the layer's mean per expert); 0: this expert's own training rows.
  int64_t schedule_rows = 0;
  // Layer-wide schedule (RefineOptions::step_sequences > 0): the calibration sequence of each row
  // ([n], values in [0, num_sequences)), the layer's sequence count, and the layer's RNG stream (the
  // same for all its experts, so that they step through the same sequences).
  const int32_t* seq = nullptr;
  int64_t num_sequences = 0;
  uint64_t layer_stream = 0;
  // The expert's biases and activation beyond plain SwiGLU (gpt-oss; model::expert_variant): the
  // biases stay constant, the loss and its gradient run through them.
  model::ExpertVariant variant;
  // Device copies of X and Y_ref (GPU runs, DeviceRows): a device step backend reads them instead of
  // uploading X and Y_ref, which may then be null (the CPU backend needs the host arrays).
  const float* X_dev = nullptr;
  const float* Y_ref_dev = nullptr;
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
  // The schedule actually used (after the rule, refine/schedule.h) and where each value came from
  // ("rule" or "set": given in RefineOptions, e.g. by a CLI flag).
  int64_t batch = 0;          // rows per step (0: the layer-wide schedule, step_sequences below)
  int64_t step_sequences = 0; // calibration sequences per step (layer-wide schedule), else 0
  int epochs = 0;
  double lr_A = 0.0, lr_V = 0.0;
  int64_t schedule_rows = 0;  // rows the rule was applied to (0 when the rule set nothing)
  bool batch_from_rule = false, epochs_from_rule = false, lr_A_from_rule = false, lr_V_from_rule = false;
  // The packed state: 0 = the initial solution, e = the end of epoch e (1-based); the last epoch
  // unless RefineOptions::restore_best picked another one.
  int selected_epoch = 0;
  double pattern_change = 0.0;   // fraction of groups whose pattern differs from the prior
  double seconds = 0.0;          // wall time of refine_expert
  // Its stages' wall time, seconds: prepare = Q_a of X, router weights, split, schedule; start = the
  // step backend's set-up (uploads) and the initial loss; optimize = the epochs (their steps' issue
  // time is curves.epoch_seconds, the rest the per-epoch evals, which wait for the steps on a GPU);
  // finish = argmax, pack and the final packed loss.
  struct StageSeconds {
    double prepare = 0, start = 0, optimize = 0, finish = 0;
  } stage_seconds;
  // The scale-only fine-tuning stage (RefineOptions::scale_finetune_epochs > 0): its Lion steps, the
  // held-out loss of the expert before and after it, and whether the tuned scales were kept (only when
  // lower). steps 0: the stage did not run.
  struct ScaleFinetuneStage {
    int64_t steps = 0;
    double loss_before = 0.0, loss_after = 0.0;
    bool kept = false;
  } scale_finetune;
  bool skipped = false;          // no (or < min_rows) calibration rows: the initial solution is returned
  std::string note;              // human-readable reason for skips/fallbacks ("" when none)
};

// Refines one expert. Shapes: gate/up V0 [I, H], down V0 [H, I]; H and I multiples of 32.
// Errors (moesq::Error) name the option or the tensor at fault.
RefineResult refine_expert(const ExpertData& data, const ProjInit& gate, const ProjInit& up,
                           const ProjInit& down, const RefineOptions& opt);

}  // namespace moesq::compress
