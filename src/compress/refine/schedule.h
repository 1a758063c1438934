// Default step budget and Lion learning rates of the moesq refinement, from the amount of data an
// expert has (docs/RESULTS.md). Used for every one of batch / epochs / lr_A / lr_V the user did not set
// (`moesq compress` without --batch / --epochs / --lr-a / --lr-v); explicit values win, and the
// rule derives the rest from them (e.g. --batch 16 alone: steps from batch 16, rates from those
// steps). report.json records the effective values and where each came from.
//
// The rule (units: rows = routed calibration tokens of one expert after the 10 % held-out split;
// steps = Lion optimizer steps of that expert; rates = Lion step size per parameter per step):
//   1. batch B: the paper's 64, halved (not below 8) while an epoch has < 32 steps (ceil(R/B) < 32);
//   2. epochs E = 10 (paper);  steps S = E · ceil(R / B);
//   3. r = max(1, S_ref / S), S_ref = 147,460 = Table-4 steps per expert
//      (Qwen3-30B-A3B: 8,192 seq × 2,048 tok × top-8 / 128 experts = 1,048,576 rows, 0.9 train,
//       batch 64, 10 epochs: 10 · ceil(943,718 / 64));
//   4. lr_A = 2.5e-4 · r^0.15,  lr_V = 5e-5 · r^0.30  (Table-4 Qwen3-30B-A3B rates × r^α).
// Large-batch regime, decided per LAYER (layer_batch below; R̄ = the layer's mean training rows per
// expert): when batch 64 gives R̄ an epoch of >= 64 steps, the batch is 64 doubled while an epoch of
// R̄ still has >= 64 steps and 2B <= min(512, 64 · (R_ref / R̄)^(2/3)), R_ref = 943,718 = Table-4 rows
// per expert; every expert of the layer then uses that batch (its steps and rates still follow from
// its own rows, steps 2–4). The cap is 64 at Table-4 scale, so Table 4 is unchanged.
// At Table-4 scale (R ≥ 943,718) r = 1: batch 64, 10 epochs, the paper's rates unchanged.
// On the tiny fixture (16,384 calibration tokens, R ≈ 1,843): batch 32, 580 steps, lr_A 5.74e-4,
// lr_V 2.63e-4; with 131,072 tokens (R̄ ≈ 14,746): layer batch 256, 580 steps for the mean expert,
// the same rates; with the default 262,144 tokens (R̄ ≈ 29,491): layer batch 512, 580 steps, the same
// rates. R̄ from 4,033 to 8,064 rows gives 128, to 16,128 256, to 41,706 512, to 117,964 256,
// to 333,654 128, then none.
//
// Source: paper 002 Table 4 (batch, epochs, rates); the exponents and the 32-steps-per-epoch floor
// were measured on the tiny fixture (docs/RESULTS.md "Default refinement schedule"):
// Lion moves each parameter by ±lr per step, so displacement grows like lr·S (agreeing signs) to
// lr·√S (random signs); exponent 0.5 over-fits ~10³ rows per expert (held-out loss rises), 0.3 for
// V helps; A's step is multiplied by κ = 100…500 in the softmax, so A takes the smaller 0.15.
// The large-batch regime was measured too (docs/RESULTS.md, third pass): at 65,536 tokens
// batch 128 / 580 steps closed at least as much as batch 64 / 1,160 steps in 2/3 of the time,
// 131,072 tokens with batch 256 closed 50.5 / 49.5 % (seeds 0 / 1) and 262,144 tokens with batch 512
// 53.5 / 53.9 %; the (R_ref / R̄)^(2/3) taper of the cap above R̄ = 41,706 is NOT measured: it only
// returns the rule to Table 4's batch 64 at R_ref.
#pragma once
#include <cstdint>

namespace moesq::compress {

namespace schedule_rule {
inline constexpr double kLrARef = 2.5e-4;         // Table 4, Qwen3-30B-A3B
inline constexpr double kLrVRef = 5e-5;           // Table 4, Qwen3-30B-A3B
inline constexpr int64_t kBatchRef = 64;          // Table 4
inline constexpr int kEpochsRef = 10;             // Table 4
inline constexpr double kStepsRef = 147460.0;     // 10 · ceil(0.9 · 8192·2048·8/128 / 64)
inline constexpr int64_t kMinStepsPerEpoch = 32;  // measured (docs/RESULTS.md)
inline constexpr int64_t kMaxStepsPerEpoch = 64;  // measured (docs/RESULTS.md): at or above, the layer batch doubles
inline constexpr int64_t kMaxBatch = 512;         // the largest batch measured (docs/RESULTS.md)
inline constexpr double kCapExponent = 2.0 / 3.0; // cap = kBatchRef · (R_ref / R̄)^this (64 at R_ref)
inline constexpr double kRowsRef = 943718.0;      // Table-4 training rows per expert: 0.9 · 8192·2048·8/128
inline constexpr int64_t kMinBatch = 8;           // below this the Lion sign is mostly noise
inline constexpr double kAlphaA = 0.15;           // lr_A ∝ (S_ref / S)^kAlphaA, measured
inline constexpr double kAlphaV = 0.30;           // lr_V ∝ (S_ref / S)^kAlphaV, measured
}  // namespace schedule_rule

struct RefineSchedule {
  int64_t batch = schedule_rule::kBatchRef;  // rows per Lion step
  int epochs = schedule_rule::kEpochsRef;    // passes over the expert's training rows
  int64_t steps = 0;                         // epochs · ceil(train_rows / batch)
  double lr_A = schedule_rule::kLrARef;      // initial Lion rate of the pattern logits A (cosine decay after)
  double lr_V = schedule_rule::kLrVRef;      // initial Lion rate of the latent weights V
};

// The rule above for `train_rows` rows. fixed_batch / fixed_epochs > 0: that value is used instead
// of the rule's (the step count, and so the rates, follow from it). train_rows <= 0: steps = 0 and
// the Table-4 values.
RefineSchedule refine_schedule(int64_t train_rows, int64_t fixed_batch = 0, int fixed_epochs = 0);

// The LAYER-WIDE step schedule (the reference implementation's, IST-DASLab/MoESQ src/trainer.py: a
// Lion step consumes a batch of calibration SEQUENCES of the layer, and every expert steps on the rows
// routed to it from those sequences): steps = epochs · ceil(num_sequences / step_sequences) for every
// expert of the layer, rates from the same rule (step 3–4 above) on that step count; batch = 0 (the
// rows per step vary by expert and step). num_sequences or step_sequences <= 0: steps = 0, Table 4's rates.
RefineSchedule layer_wide_schedule(int64_t num_sequences, int64_t step_sequences, int epochs);

// The large-batch regime above for a layer whose experts have `mean_train_rows` training rows on
// average: the batch (128, 256 or 512) every expert of the layer uses, or 0 outside the regime (each
// expert then takes refine_schedule's own batch). Pass it to refine_schedule as fixed_batch.
int64_t layer_batch(int64_t mean_train_rows);

}  // namespace moesq::compress
