// Lion optimizer (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Alg. 2) with
// decoupled weight decay, and the step schedules of moesq refinement (paper 002 Appendix B):
// cosine learning-rate decay to a final fraction, linear τ and κ annealing over optimizer steps.
//
//   c = β1·m + (1 − β1)·g;   θ ← θ − lr·(sign(c) + λ·θ);   m ← β2·m + (1 − β2)·g
//
// Non-obvious decision: sign(0) = 0, so a parameter with an exactly zero gradient and zero momentum
// (e.g. the latent value at a pruned position whose mask is exactly 0 under a fixed support) moves
// only by weight decay — it never takes a full ±lr step from noise.
#pragma once
#include <cstdint>
#include <vector>

namespace moesq::compress::refine {

struct LionConfig {
  double beta1 = 0.9, beta2 = 0.95;
  double weight_decay = 1.0;  // λ, decoupled (multiplied by lr, not by the gradient)
};

// One Lion step on n parameters. theta, m: [n] (m is the momentum, updated in place); g: [n].
void lion_step(float* theta, float* m, const float* g, int64_t n, double lr, const LionConfig& cfg);

// Plain restatement of the update order for tests: identical math, double accumulation.
void lion_step_ref(float* theta, float* m, const float* g, int64_t n, double lr,
                   const LionConfig& cfg);

// Cosine decay from lr0 (step 0) to final_frac·lr0 (last step): lr0·(f + (1 − f)·(1 + cos πu)/2),
// u = step / (num_steps − 1) (u = 0 for a single step).
double cosine_lr(double lr0, double final_frac, int64_t step, int64_t num_steps);

// Linear interpolation v0 → v1 over the steps (τ: 2.0 → 0.05, κ: 100 → 500).
double linear_schedule(double v0, double v1, int64_t step, int64_t num_steps);

}  // namespace moesq::compress::refine
