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

// ---- counter-based random numbers ---------------------------------------------------------------
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Key of one random stream: seed × stream (expert id) × purpose × step × projection.
inline uint64_t rng_key(uint64_t seed, uint64_t stream, uint64_t purpose, uint64_t step,
                        uint64_t proj) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ stream);
  h = splitmix64(h ^ purpose);
  h = splitmix64(h ^ step);
  return splitmix64(h ^ proj);
}
// Uniform in the open interval (0, 1): 53 random bits, offset by half an ulp so 0 never occurs.
inline double rng_uniform(uint64_t key, uint64_t index) {
  return (static_cast<double>(splitmix64(key ^ splitmix64(index)) >> 11) + 0.5) * 0x1.0p-53;
}
inline double rng_normal(uint64_t key, uint64_t index) {  // Box–Muller, one output per index
  const double u1 = rng_uniform(key, 2 * index), u2 = rng_uniform(key, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
// Gumbel(0, 1) = −log(−log u). The outer log runs in fp32 (its argument −log u is in
// [1.1e-16, 37], where fp32 relative precision is ample for noise); the inner one stays fp64 so
// that u close to 1 keeps its resolution.
inline float rng_gumbel(uint64_t key, uint64_t index) {
  return -std::log(static_cast<float>(-std::log(rng_uniform(key, index))));
}

// Purposes of the random streams (part of the key, so streams never overlap).
enum RngPurpose : uint64_t { kRngPriorInit = 1, kRngGumbel = 2, kRngShuffle = 3, kRngSplit = 4 };

// ---- prior initialization -----------------------------------------------------------------------
// A[r,p] = σ·(ε + s·(overlap(prior_r, p) − mean_p overlap)), ε ~ N(0,1); overlap counts the kept
// positions pattern p shares with the prior pattern (4, 2 or 0).
//   prior: [R] pattern ids; A: [R, 6].
template <typename T>
void prior_logits(const uint8_t* prior, int64_t R, double sigma, double s, uint64_t key, T* A) {
  for (int64_t r = 0; r < R; ++r) {
    const int pr = prior[r];
    std::array<double, kNumPatterns> overlap{};
    double mean = 0.0;
    for (int p = 0; p < kNumPatterns; ++p) {
      for (int j = 0; j < kGroup; ++j) overlap[p] += kPatternRho[pr][j] * kPatternRho[p][j];
      mean += overlap[p] / kNumPatterns;
    }
    for (int p = 0; p < kNumPatterns; ++p) {
      const double eps = rng_normal(key, static_cast<uint64_t>(r * kNumPatterns + p));
      A[r * kNumPatterns + p] = static_cast<T>(sigma * (eps + s * (overlap[p] - mean)));
    }
  }
}

// G: [R, 6] i.i.d. Gumbel(0, 1) for one step of one projection.
template <typename T>
void gumbel_noise(int64_t R, uint64_t key, T* G) {
  for (int64_t i = 0; i < R * kNumPatterns; ++i)
    G[i] = static_cast<T>(rng_gumbel(key, static_cast<uint64_t>(i)));
}

// ---- Eq. 2 forward ------------------------------------------------------------------------------
// Softmax terms below e^-60 (relative to the largest) are set to exactly 0: they cannot change Z in
// fp32, and as denormal-bound values they would make every later step (exp, the softmax Jacobian,
// Lion's momentum) run on the slow denormal path once κ/τ has sharpened π — and Lion would turn
// their 1e-30 gradients into full ±lr steps.
constexpr double kSoftmaxCutoff = -60.0;

// π = softmax((κ·A + G)/τ) per group, Z = Σ_p π_p ρ_p. G may be null (noise-free relaxation, used
// for the held-out "soft" loss).  A, G, pi: [R, 6]; Z: [R, 8] (= [N, K] row-major).
template <typename T>
void soft_mask_forward(const T* A, const T* G, int64_t R, double kappa, double tau, T* pi, T* Z) {
  for (int64_t r = 0; r < R; ++r) {
    const T* a = A + r * kNumPatterns;
    T* pr = pi + r * kNumPatterns;
    T u[kNumPatterns];
    T umax = -INFINITY;
    for (int p = 0; p < kNumPatterns; ++p) {
      u[p] = static_cast<T>((kappa * a[p] + (G ? G[r * kNumPatterns + p] : T(0))) / tau);
      umax = u[p] > umax ? u[p] : umax;
    }
    T sum = 0;
    for (int p = 0; p < kNumPatterns; ++p) {
      const T d = u[p] - umax;
      sum += (pr[p] = d < T(kSoftmaxCutoff) ? T(0) : std::exp(d));
    }
    for (int p = 0; p < kNumPatterns; ++p) pr[p] /= sum;
    // Z of both positions of pair q = Σ of π over the 3 patterns that keep q.
    T pair[4] = {0, 0, 0, 0};
    for (int p = 0; p < kNumPatterns; ++p) {
      pair[format::kPatternPairs[p][0]] += pr[p];
      pair[format::kPatternPairs[p][1]] += pr[p];
    }
    T* z = Z + r * kGroup;
    for (int q = 0; q < 4; ++q) z[2 * q] = z[2 * q + 1] = pair[q];
  }
}

// Argmax pattern per group (ties → lowest id), and its one-hot mask Z (Algorithm 1 line 17).
// patterns: [R]; Z: [R, 8] (may be null).
template <typename T>
void hard_mask(const T* A, int64_t R, uint8_t* patterns, T* Z) {
  for (int64_t r = 0; r < R; ++r) {
    int best = 0;
    for (int p = 1; p < kNumPatterns; ++p)
      if (A[r * kNumPatterns + p] > A[r * kNumPatterns + best]) best = p;
    patterns[r] = static_cast<uint8_t>(best);
    if (Z)
      for (int j = 0; j < kGroup; ++j) Z[r * kGroup + j] = kPatternRho[best][j];
  }
}

// One-hot Z of given patterns. patterns: [R]; Z: [R, 8].
template <typename T>
void pattern_mask(const uint8_t* patterns, int64_t R, T* Z) {
  for (int64_t r = 0; r < R; ++r)
    for (int j = 0; j < kGroup; ++j) Z[r * kGroup + j] = kPatternRho[patterns[r]][j];
}

// ---- Eq. 2 backward ----------------------------------------------------------------------------
// Given dL/dY [N, K] (= dL/dW̃ under the STE of Eq. 3), Y = Z ⊙ V:
//   dV = dY ⊙ Z,  dZ = dY ⊙ V,  dπ_p = Σ_j dZ_j ρ_p[j],
//   du = π ⊙ (dπ − ⟨π, dπ⟩)  (softmax Jacobian),  dA = (κ/τ)·du.
// dA may be null (V-only update). dA and dV are OVERWRITTEN. Shapes as in soft_mask_forward.
template <typename T>
void soft_mask_backward(const T* dY, const T* V, const T* Z, const T* pi, int64_t R, double kappa,
                        double tau, T* dA, T* dV) {
  const T scale = static_cast<T>(kappa / tau);
  for (int64_t r = 0; r < R; ++r) {
    const T* dy = dY + r * kGroup;
    const T* v = V + r * kGroup;
    const T* z = Z + r * kGroup;
    T* dv = dV + r * kGroup;
    for (int j = 0; j < kGroup; ++j) dv[j] = dy[j] * z[j];
    if (!dA) continue;
    const T* pr = pi + r * kNumPatterns;
    T pair[4];  // Σ over the pair's two positions of dZ = dY ⊙ V
    for (int q = 0; q < 4; ++q) pair[q] = dy[2 * q] * v[2 * q] + dy[2 * q + 1] * v[2 * q + 1];
    T dpi[kNumPatterns];
    T dot = 0;
    for (int p = 0; p < kNumPatterns; ++p) {
      dpi[p] = pair[format::kPatternPairs[p][0]] + pair[format::kPatternPairs[p][1]];
      dot += pr[p] * dpi[p];
    }
    for (int p = 0; p < kNumPatterns; ++p)
      dA[r * kNumPatterns + p] = scale * pr[p] * (dpi[p] - dot);
  }
}

}  // namespace moesq::compress::refine
