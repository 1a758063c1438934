// Launchers: the Gumbel-softmax paired 4:8 support of one projection of the moesq refinement (paper
// 002 §3.2, Eq. 2) on the GPU, forward and backward + Lion, over R groups of 8 weights along K.
//   forward:  π = softmax((κ·A + G)/τ) (G drawn in the kernel from the step's counter key), Z = Σ π ρ,
//             W = Z ⊙ V — or the argmax / a fixed pattern's one-hot Z (hard evaluation, V-only update);
//   backward: from dW (= dL/dW̃ under the STE of Eq. 3): dV = dW ⊙ Z, dA = (κ/τ)·π ⊙ (dπ − ⟨π, dπ⟩),
//             then one Lion step on A and V with their momenta (refine/lion.h), fused.
// CPU twins (`_ref`, same descriptors on host pointers) run the same per-group code
// (gumbel_math.h), so a twin and its kernel differ only where the two libms' exp/log do.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

enum class SupportMode {
  kGumbel,     // relaxed, with Gumbel noise from `key` (a training step)
  kNoiseFree,  // relaxed, no noise (the held-out "soft" loss)
  kArgmax,     // hard: the argmax pattern of A (the held-out "hard" loss, what is packed)
  kFixed,      // hard: the given `fixed` patterns (the V-only ablation)
};

struct GumbelSupportArgs {
  int64_t R = 0;                   // groups (N·K/8)
  SupportMode mode = SupportMode::kGumbel;
  const float* A = nullptr;        // [R, 6] pattern logits (not read in kFixed)
  const float* V = nullptr;        // [R, 8] latent weights
  const uint8_t* fixed = nullptr;  // [R] pattern ids in [0, 6) (kFixed only)
  double kappa = 100.0, tau = 2.0; // logit scale κ and temperature τ of Eq. 2 (relaxed modes)
  uint64_t key = 0;                // kGumbel: ops::gumbel::rng_key(seed, stream, purpose, step, projection);
                                   // element i of the [R, 6] noise is rng_gumbel(key, i)
  float* pi = nullptr;             // [R, 6] out: π (relaxed modes; may be null: not stored)
  float* W = nullptr;              // [R, 8] out: Z ⊙ V
  uint8_t* patterns = nullptr;     // [R] out: the argmax pattern ids (kArgmax; may be null)
  // Optional, for the Q_w that follows (ops/fake_quant's amax_given): *amax = max(*amax, max |W|) —
  // the caller zeroes it, and several launches may fold into one amax (gate and up share one γ) —
  // and *nonfinite = 1 when W holds a NaN or an infinity. Saves the separate amax pass over W.
  float* amax = nullptr;
  int32_t* nonfinite = nullptr;
};

struct GumbelSupportLionArgs {
  int64_t R = 0;
  const float* dW = nullptr;       // [R, 8] dL/dW̃ of the projection
  const float* pi = nullptr;       // [R, 6] π of the forward (relaxed; null: recomputed, or support fixed)
  const uint8_t* fixed = nullptr;  // [R] the fixed patterns when the support is fixed
  double kappa = 100.0, tau = 2.0; // as in the forward (dA scale κ/τ)
  // Recompute π instead of reading it: the forward's kGumbel code (soft_group_forward) on the same A
  // (before this update), the same noise key, κ and τ — the same bits as the stored π, without its
  // [R, 6] write in the forward and read here (264 MB a step for a Kimi-K2.5 expert).
  bool recompute_pi = false;
  uint64_t key = 0;                // the forward's noise key (recompute_pi)
  float* A = nullptr;              // [R, 6] updated in place (null with a fixed support)
  float* V = nullptr;              // [R, 8] updated in place (dV uses V BEFORE its update)
  float* mom_A = nullptr;          // [R, 6] Lion momentum of A (null with a fixed support)
  float* mom_V = nullptr;          // [R, 8] Lion momentum of V
  double lr_A = 0.0, lr_V = 0.0;   // this step's rates
  double beta1 = 0.9, beta2 = 0.95, weight_decay = 1.0;  // Lion
};

// The prior initialization of the logits (paper 002 §3.2, Eq. 2 init), drawn where they are used:
// A[r, p] = ops::gumbel::prior_logit(prior[r], p, σ, s, key, 6r + p) — the CPU refinement's
// refine::prior_logits, element for element (up to the libms' log / cos in the Box–Muller draw).
struct GumbelPriorArgs {
  int64_t R = 0;                   // groups
  const uint8_t* prior = nullptr;  // [R] prior (SGPTQ) pattern ids in [0, 6)
  double sigma = 1.0, s = 1.0;     // noise scale σ and prior strength s
  uint64_t key = 0;                // rng_key(seed, stream, kRngPriorInit, 0, projection)
  float* A = nullptr;              // [R, 6] out
};

// Errors (moesq::Error): R < 0, a null pointer the mode needs, τ ≤ 0; the launchers also need the
// [R, 8] arrays 16-byte and the [R, 6] arrays 8-byte aligned (vector accesses; cudaMalloc'd is).
void gumbel_support_forward(const GumbelSupportArgs& a, cudaStream_t stream);
void gumbel_support_lion(const GumbelSupportLionArgs& a, cudaStream_t stream);
// The same for n (1 to 3) projections in ONE launch — an expert's gate, up and down, a third of the
// launches — bit-identical to n single launches (each block works on one projection with the single
// launch's code). Errors as the single launchers', naming the first bad projection; n out of range.
void gumbel_support_forward(const GumbelSupportArgs* a, int n, cudaStream_t stream);
void gumbel_support_lion(const GumbelSupportLionArgs* a, int n, cudaStream_t stream);
// Errors: R < 0, a null pointer; the kernel clamps pattern ids out of [0, 6), the twin names them.
void gumbel_prior_logits(const GumbelPriorArgs& a, cudaStream_t stream);
void gumbel_support_check(const GumbelSupportArgs& a);
void gumbel_support_check(const GumbelPriorArgs& a);
void gumbel_support_check(const GumbelSupportLionArgs& a);

// The CPU twins on host pointers (same outputs; pattern ids out of [0, 6) are an Error here, the
// kernel clamps them).
void gumbel_support_forward_ref(const GumbelSupportArgs& a);
void gumbel_support_lion_ref(const GumbelSupportLionArgs& a);
void gumbel_prior_logits_ref(const GumbelPriorArgs& a);

}  // namespace moesq::ops
