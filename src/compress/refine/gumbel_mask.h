// The Gumbel-softmax pattern mask: the relaxed paired 4:8 support of moesq refinement (paper 002
// §3.2, Eq. 2), its backward, and the counter-based random numbers it draws:
// pattern logits A [R, 6] (one row per group of 8 weights along K) → Gumbel-softmax weights
// π [R, 6] → soft mask Z [R, 8] = Σ_p π_p ρ_p → soft-masked weights Y = Z ⊙ V.
//
// Non-obvious decision: random numbers are COUNTER-BASED (splitmix64 of a key built from seed,
// stream, step, projection and element index), not a sequential engine. A refinement run is then
// bitwise reproducible from the seed whatever the thread schedule of the caller, and std::
// distributions (implementation-defined across standard libraries) are never used.
//
// These are small elementwise loops shared by the fast float path and the float64 reference of
// refine/objective.h, hence templates on the scalar type T.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

#include "format/nvfp4.h"
#include "ops/gumbel_support/gumbel_math.h"

namespace moesq::compress::refine {

constexpr int kGroup = format::kGroup;             // 8 weights per sparsity group
constexpr int kNumPatterns = format::kNumPatterns;  // 6 admissible patterns

// ρ_p[j]: 1 when position j of a group is kept by pattern p (derived from format::kPatternPairs,
// the single source of the pattern order).
constexpr std::array<std::array<uint8_t, kGroup>, kNumPatterns> make_pattern_rho() {
  std::array<std::array<uint8_t, kGroup>, kNumPatterns> rho{};
  for (int p = 0; p < kNumPatterns; ++p)
    for (int q : format::kPatternPairs[p]) rho[p][2 * q] = rho[p][2 * q + 1] = 1;
  return rho;
}
inline constexpr auto kPatternRho = make_pattern_rho();

// ---- counter-based random numbers (ops/gumbel_support/gumbel_math.h: one definition for the CPU
// refinement and the GPU kernels) --------------------------------------------------------------------
using ops::gumbel::rng_gumbel;
using ops::gumbel::rng_key;
using ops::gumbel::rng_uniform;
using ops::gumbel::splitmix64;
using ops::gumbel::rng_normal;  // Box–Muller, one output per index

// Purposes of the random streams (part of the key, so streams never overlap).
enum RngPurpose : uint64_t { kRngPriorInit = 1, kRngGumbel = 2, kRngShuffle = 3, kRngSplit = 4, kRngScaleShuffle = 5 };

// ---- prior initialization -----------------------------------------------------------------------
// A[r,p] = σ·(ε + s·(overlap(prior_r, p) − mean_p overlap)), ε ~ N(0,1); overlap counts the kept
// positions pattern p shares with the prior pattern (4, 2 or 0). The element is
// ops::gumbel::prior_logit, which the GPU refinement draws with (ops::gumbel_prior_logits).
//   prior: [R] pattern ids in [0, 6); A: [R, 6].
inline void prior_logits(const uint8_t* prior, int64_t R, double sigma, double s, uint64_t key, float* A) {
  for (int64_t r = 0; r < R; ++r)
    for (int p = 0; p < kNumPatterns; ++p) {
      const int64_t i = r * kNumPatterns + p;
      A[i] = ops::gumbel::prior_logit(prior[r], p, sigma, s, key, static_cast<uint64_t>(i));
    }
}

// G: [R, 6] i.i.d. Gumbel(0, 1) for one step of one projection.
template <typename T>
void gumbel_noise(int64_t R, uint64_t key, T* G) {
  for (int64_t i = 0; i < R * kNumPatterns; ++i)
    G[i] = static_cast<T>(rng_gumbel(key, static_cast<uint64_t>(i)));
}

// ---- Eq. 2 forward and backward over R groups (the per-group math: ops::gumbel, gumbel_math.h) ----
// π = softmax((κ·A + G)/τ) per group, Z = Σ_p π_p ρ_p (softmax terms below e^-60 of the largest are
// exactly 0, ops::gumbel::kSoftmaxCutoff). G may be null (noise-free relaxation, used for the
// held-out "soft" loss).  A, G, pi: [R, 6]; Z: [R, 8] (= [N, K] row-major).
template <typename T>
void soft_mask_forward(const T* A, const T* G, int64_t R, double kappa, double tau, T* pi, T* Z) {
  for (int64_t r = 0; r < R; ++r)
    ops::gumbel::soft_group_forward<T>(A + r * kNumPatterns, G ? G + r * kNumPatterns : nullptr, kappa, tau,
                                       pi + r * kNumPatterns, Z + r * kGroup);
}

// Argmax pattern per group (ties → lowest id), and its one-hot mask Z (Algorithm 1 line 17).
// patterns: [R]; Z: [R, 8] (may be null).
template <typename T>
void hard_mask(const T* A, int64_t R, uint8_t* patterns, T* Z) {
  for (int64_t r = 0; r < R; ++r) {
    const int best = ops::gumbel::argmax_pattern<T>(A + r * kNumPatterns);
    patterns[r] = static_cast<uint8_t>(best);
    if (Z) ops::gumbel::z_of_pattern<T>(best, Z + r * kGroup);
  }
}

// One-hot Z of given patterns. patterns: [R]; Z: [R, 8].
template <typename T>
void pattern_mask(const uint8_t* patterns, int64_t R, T* Z) {
  for (int64_t r = 0; r < R; ++r) ops::gumbel::z_of_pattern<T>(patterns[r], Z + r * kGroup);
}

// Given dL/dY [N, K] (= dL/dW̃ under the STE of Eq. 3), Y = Z ⊙ V:
//   dV = dY ⊙ Z,  dZ = dY ⊙ V,  dπ_p = Σ_j dZ_j ρ_p[j],
//   du = π ⊙ (dπ − ⟨π, dπ⟩)  (softmax Jacobian),  dA = (κ/τ)·du.
// dA may be null (V-only update). dA and dV are OVERWRITTEN. Shapes as in soft_mask_forward.
template <typename T>
void soft_mask_backward(const T* dY, const T* V, const T* Z, const T* pi, int64_t R, double kappa,
                        double tau, T* dA, T* dV) {
  const T scale = static_cast<T>(kappa / tau);
  for (int64_t r = 0; r < R; ++r)
    ops::gumbel::soft_group_backward<T>(dY + r * kGroup, V + r * kGroup, Z + r * kGroup,
                                        dA ? pi + r * kNumPatterns : nullptr, scale,
                                        dA ? dA + r * kNumPatterns : nullptr, dV + r * kGroup);
}

}  // namespace moesq::compress::refine
