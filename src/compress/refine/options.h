// Options of the moesq refinement (paper 002 Appendix B, Table 4 defaults), typed end to end: the CLI
// binds its flags to a RefineOptions (so these defaults are the CLI's), compress::validate checks it
// once before any work, refine_expert reads it.
// JSON only in report.json ("refine_options") and the resume manifest (compress/work_dir.h).
#pragma once
#include <string>
#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "format/nvfp4.h"

namespace moesq::compress {

namespace refine {
class StepBackend;  // refine/step_backend.h
}

struct RefineOptions {
  int p = 2;              // router weighting of Eq. 4: row weight g^p (2 = moesq; 0 = uniform ablation)
  bool update_A = true;   // false: "V only" ablation, the support stays the prior (SGPTQ) one
  int epochs = 10;        // passes over the expert's training rows
  int64_t batch = 64;     // rows per optimizer step (paper Table 4)
  int64_t micro_batch = 64;  // rows per GEMM pass (gradients accumulated; bounds memory only)
  // Lion learning rates. Defaults: paper Table 4 (Qwen3-30B-A3B), tuned there for ~10^5 steps per
  // expert. Lion moves every parameter by ±lr per step, so fewer steps need larger rates: the
  // schedule rule below (refine/schedule.h) scales them with the steps an expert gets.
  double lr_A = 2.5e-4, lr_V = 5e-5;
  // Which of batch / epochs / lr_A / lr_V the schedule rule (refine/schedule.h) sets, from the
  // expert's training rows (false: the field above is used as given). The library default is
  // "as given"; `moesq compress` turns the rule on for every one of them the user did not set.
  bool rule_batch = false, rule_epochs = false, rule_lr_A = false, rule_lr_V = false;
  // Multipliers of the rates the rule sets (`--lr-a-scale`, `--lr-v-scale`; explicit rates are used as
  // given): the rule's shape over experts and step counts kept, its level moved (docs/RESULTS.md).
  double rule_lr_A_scale = 1.0, rule_lr_V_scale = 1.0;
  // The rows the rule is applied to: true = each expert's own training rows (experts with few rows
  // get a smaller batch and larger rates); false = the layer's mean training rows per expert
  // (ExpertData::schedule_rows; one schedule for all experts of a layer).
  bool rule_per_expert = true;
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
  // Which state is packed (early stopping on the held-out split, docs/RESULTS.md "best-epoch
  // restore"): false = the last epoch's (paper Algorithm 1 line 17); true = the state, among the
  // initial solution (epoch 0) and the end of every epoch, with the lowest held-out hard Eq. 4 loss
  // (RefineCurves::hard_loss), so the packed expert is never worse on the held-out rows than the
  // initial one. Needs held-out rows (heldout_fraction > 0 and n >= 2); without them: the last epoch.
  bool restore_best = false;
  // The step schedule: 0 = per-expert row batches (`batch` rows per step, each expert its own steps);
  // N > 0 = LAYER-WIDE (refine/schedule.h layer_wide_schedule): a step consumes N calibration sequences
  // of the layer, the same ones for every expert (shuffled per epoch from the seed and the layer), and
  // each expert steps on its training rows from them (a step without rows leaves the expert as is).
  // Needs ExpertData::seq. `batch` is then unused (the rule sets epochs and rates as above).
  int64_t step_sequences = 0;
  // Experts with fewer calibration rows than this are not refined (treated like an expert without
  // rows: the initial solution is returned, skipped = true, the note says why). 0: refine all.
  int64_t min_rows = 0;
  // Scale-only fine-tuning after the refinement (refine/scale_finetune.h; issue 29, the reference's GSQ
  // stage): epochs over the expert's training rows (0: off) and the Lion rate of its log-multipliers;
  // the tuned scales are kept only where they lower the held-out Eq. 4 loss. CPU only for now.
  int scale_finetune_epochs = 0;
  double scale_finetune_lr = 1e-3;
  // The refinement's targets Y_ref (`--targets`): false = the original expert on the expert's rows X
  // of the compressed model's states (paper Algorithm 1); true = the original expert on the SAME
  // tokens' rows of the ORIGINAL model's states (a second, uncompressed calibration stream run beside
  // the compressed one; asymmetric calibration as in GPTAQ, arXiv 2504.02692), so the compressed expert
  // is also trained to undo the drift of the layers before it. The inputs stay X (what the deployed
  // model feeds the expert). Layer 1's rows are the same in both streams. CPU only for now.
  bool original_targets = false;
  // Where the optimizer steps run (refine/step_backend.h): nullptr = the CPU (cblas); otherwise a
  // device backend's factory (`compress --device cuda`: refine/cuda_step_backend.h). Not part of the
  // options JSON: report.json and the resume manifest record the device separately.
  std::unique_ptr<refine::StepBackend> (*device)() = nullptr;
  // GPU backend only: the five GEMMs of a step on TF32 tensor cores (inputs rounded to a 10-bit
  // mantissa, fp32 accumulation) instead of fp32 FMA (`--gpu-gemm tf32`). The CPU ignores it.
  bool tf32_gemm = false;
  // GPU backend only: the three BACKWARD GEMMs of a step (dW̃_down, dh, dW̃_gu) on TF32 tensor cores,
  // the two forward GEMMs (the loss, the activation quantization's inputs) in fp32
  // (`--gpu-gemm tf32-backward`); Lion consumes the gradients through a sign. The CPU ignores it.
  bool tf32_backward = false;
  // GPU backend only: the two FORWARD GEMMs on bf16 tensor cores over the unscaled NVFP4 operands
  // (ops/fake_quant's unscaled_bf16: Q_a(X), Q_a(h) per row and Q_w(W̃) per tensor are E2M1 · UE4M3
  // values over a γ, exact in bf16), then divided by the two γ (ops/descale_rows): every product is
  // exact, the sum is fp32 — fp32-class accuracy at the bf16 tensor-core rate (`--gpu-gemm bf16-forward`,
  // with tf32_backward). The CPU ignores it.
  bool bf16_forward = false;
};

// The GPU GEMM precision by its `--gpu-gemm` name — fp32 | tf32 | tf32-backward | bf16-forward — into
// tf32_gemm / tf32_backward / bf16_forward (bf16-forward keeps the gradients on TF32). Error naming
// `flag` for another name.
void set_gpu_gemm(RefineOptions& o, const std::string& mode, const char* flag = "--gpu-gemm");
extern const char* const kGpuGemmModes[4];

// Every refinement option in range (moesq::Error naming the option otherwise). refine_expert calls it
// too, but callers validate once up front (compress::validate) so a bad value fails before any work.
void validate(const RefineOptions& o);

// The held-out split of an expert's n rows (the refinement's and the schedule rule's, which must
// agree): floor(o.heldout_fraction · n) rows are held out of training, at most n − 1 (one training row
// stays; 0 for n = 0).
int64_t heldout_rows(const RefineOptions& o, int64_t n);

// Options ↔ JSON (the report's "refine_options"; the options themselves travel typed). Keys are the
// field names above; missing keys keep their defaults; an unknown key or a wrong type is an Error
// naming the key (a typo must not silently fall back to a default).
RefineOptions refine_options_from_json(const nlohmann::json& j);
nlohmann::json refine_options_to_json(const RefineOptions& o);

}  // namespace moesq::compress
