// The per-group math of the Gumbel-softmax paired 4:8 support (paper 002 §3.2, Eq. 2) and its
// Lion update, written ONCE for the host and the device: the counter-based random numbers, the
// relaxed support of one group of 8 weights (π, Z), its backward (dA, dV) and the Lion element step.
// Used by compress/refine (the CPU refinement, through refine/gumbel_mask.h and refine/lion.cpp) and
// by the gumbel_support op (its CUDA kernels and its `_ref` twin), so every path draws the same noise
// and runs the same fp32/fp64 expressions in the same order.
//
// Non-obvious decisions:
//  * Random numbers are COUNTER-BASED (splitmix64 of a key built from seed, stream, step, projection
//    and element index), never a sequential engine: a refinement is bitwise reproducible from the
//    seed whatever the thread schedule, and the GPU draws the same bits as the CPU for the same
//    counter. Only the two logs of a Gumbel draw go through each side's libm (the device's log may
//    differ from glibc's in the last ulp).
//  * Pattern tables are functions here (constexpr switch), not arrays, so device code can index them.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MOESQ_GS_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define MOESQ_GS_HD inline
#endif

namespace moesq::ops::gumbel {

constexpr int kGroup = 8;        // weights per paired 4:8 group (format::kGroup)
constexpr int kNumPatterns = 6;  // admissible patterns (format::kNumPatterns)

// Kept pair i (0, 1) of pattern p: {0,1},{0,2},{0,3},{1,2},{1,3},{2,3} (format::kPatternPairs; a test
// checks they agree).
MOESQ_GS_HD constexpr int pattern_pair(int p, int i) {
  switch (p) {
    case 0: return i == 0 ? 0 : 1;
    case 1: return i == 0 ? 0 : 2;
    case 2: return i == 0 ? 0 : 3;
    case 3: return i == 0 ? 1 : 2;
    case 4: return i == 0 ? 1 : 3;
    default: return i == 0 ? 2 : 3;
  }
}

// ---- counter-based random numbers ---------------------------------------------------------------
MOESQ_GS_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Key of one random stream: seed × stream (expert id) × purpose × step × projection.
MOESQ_GS_HD uint64_t rng_key(uint64_t seed, uint64_t stream, uint64_t purpose, uint64_t step, uint64_t proj) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ stream);
  h = splitmix64(h ^ purpose);
  h = splitmix64(h ^ step);
  return splitmix64(h ^ proj);
}
// Uniform in the open interval (0, 1): 53 random bits, offset by half an ulp so 0 never occurs.
MOESQ_GS_HD double rng_uniform(uint64_t key, uint64_t index) {
  return (static_cast<double>(splitmix64(key ^ splitmix64(index)) >> 11) + 0.5) * 0x1.0p-53;
}
// Gumbel(0, 1) = −log(−log u). The outer log runs in fp32 (its argument −log u is in [1.1e-16, 37],
// where fp32 relative precision is ample for noise); the inner one stays fp64 so that u close to 1
// keeps its resolution.
MOESQ_GS_HD float rng_gumbel(uint64_t key, uint64_t index) {
#if defined(__CUDA_ARCH__)
  return -logf(static_cast<float>(-log(rng_uniform(key, index))));
#else
  return -std::log(static_cast<float>(-std::log(rng_uniform(key, index))));
#endif
}

// N(0, 1) by Box–Muller, one output per index (uniforms 2·index and 2·index + 1). fp64 throughout;
// only log, sqrt and cos go through each side's libm (the device's may differ in the last ulp).
MOESQ_GS_HD double rng_normal(uint64_t key, uint64_t index) {
  const double u1 = rng_uniform(key, 2 * index), u2 = rng_uniform(key, 2 * index + 1);
#if defined(__CUDA_ARCH__)
  return __dmul_rn(sqrt(__dmul_rn(-2.0, log(u1))), cos(__dmul_rn(6.283185307179586, u2)));
#else
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
#endif
}

MOESQ_GS_HD float exp_of(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}
MOESQ_GS_HD double exp_of(double x) {
#if defined(__CUDA_ARCH__)
  return exp(x);
#else
  return std::exp(x);
#endif
}

// Softmax terms below e^-60 (relative to the largest) are set to exactly 0: they cannot change Z in
// fp32, and as denormal-bound values they would make every later step run on the slow denormal path
// once κ/τ has sharpened π — and Lion would turn their 1e-30 gradients into full ±lr steps.
constexpr double kSoftmaxCutoff = -60.0;

// ---- Eq. 2 forward of one group -------------------------------------------------------------------
// π = softmax((κ·a + g)/τ) (g = 0 without noise: the noise-free relaxation), Z = Σ_p π_p ρ_p, both
// positions of pair q getting the pair's mass. a, g, pi: [6]; z: [8]. T = float (the refinement,
// host and device) or double (the CPU reference objective). (κ·a + g)/τ is evaluated in fp64 and
// rounded to T, as the CPU refinement always has; on the device without FMA (like the host), so every
// kernel that inlines this (the forward, Lion's recomputed π) gets the same bits.
template <typename T>
MOESQ_GS_HD void soft_group_forward(const T* a, const T* g, double kappa, double tau, T* pi, T* z) {
  T u[kNumPatterns];
  T umax = -INFINITY;
  for (int p = 0; p < kNumPatterns; ++p) {
#if defined(__CUDA_ARCH__)
    u[p] = static_cast<T>(__dadd_rn(__dmul_rn(kappa, static_cast<double>(a[p])), g ? static_cast<double>(g[p]) : 0.0) / tau);
#else
    u[p] = static_cast<T>((kappa * a[p] + (g ? g[p] : T(0))) / tau);
#endif
    umax = u[p] > umax ? u[p] : umax;
  }
  T sum = 0;
  for (int p = 0; p < kNumPatterns; ++p) {
    const T d = u[p] - umax;
    sum += (pi[p] = d < T(kSoftmaxCutoff) ? T(0) : exp_of(d));
  }
  for (int p = 0; p < kNumPatterns; ++p) pi[p] /= sum;
  T pair[4] = {0, 0, 0, 0};
  for (int p = 0; p < kNumPatterns; ++p) {
    pair[pattern_pair(p, 0)] += pi[p];
    pair[pattern_pair(p, 1)] += pi[p];
  }
  for (int q = 0; q < 4; ++q) z[2 * q] = z[2 * q + 1] = pair[q];
}

// Z of a group from its π (the same pair sums as soft_group_forward, so the same bits).
template <typename T>
MOESQ_GS_HD void z_from_pi(const T* pi, T* z) {
  T pair[4] = {0, 0, 0, 0};
  for (int p = 0; p < kNumPatterns; ++p) {
    pair[pattern_pair(p, 0)] += pi[p];
    pair[pattern_pair(p, 1)] += pi[p];
  }
  for (int q = 0; q < 4; ++q) z[2 * q] = z[2 * q + 1] = pair[q];
}

// Argmax pattern of a group's logits (ties → lowest id; Algorithm 1 line 17).
template <typename T>
MOESQ_GS_HD int argmax_pattern(const T* a) {
  int best = 0;
  for (int p = 1; p < kNumPatterns; ++p)
    if (a[p] > a[best]) best = p;
  return best;
}

// One-hot Z of pattern p: 1 at the two kept pairs' positions.
template <typename T>
MOESQ_GS_HD void z_of_pattern(int p, T* z) {
  for (int j = 0; j < kGroup; ++j) z[j] = T(0);
  for (int i = 0; i < 2; ++i) z[2 * pattern_pair(p, i)] = z[2 * pattern_pair(p, i) + 1] = T(1);
}

// ---- the prior initialization of the logits (Eq. 2 init) ---------------------------------------
// Kept positions pattern p shares with pattern q: 2 per shared pair (4, 2 or 0).
MOESQ_GS_HD int pattern_overlap(int p, int q) {
  int shared = 0;
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 2; ++k) shared += pattern_pair(p, i) == pattern_pair(q, k);
  return 2 * shared;
}
// A[r, p] = σ·(ε + s·(overlap(prior_r, p) − mean_q overlap(prior_r, q))), ε = rng_normal(key, 6r + p):
// the logit of pattern p of a group whose prior (SGPTQ) pattern is `prior`; `index` = 6r + p. The mean
// is summed in pattern order as overlap/6 terms, every product and sum rounded on its own (no FMA on
// the device), so host and device agree up to their libms' log / cos.
MOESQ_GS_HD float prior_logit(int prior, int p, double sigma, double s, uint64_t key, uint64_t index) {
  double mean = 0.0;
  for (int q = 0; q < kNumPatterns; ++q) mean += static_cast<double>(pattern_overlap(prior, q)) / kNumPatterns;
  const double eps = rng_normal(key, index);
  const double centred = static_cast<double>(pattern_overlap(prior, p)) - mean;
#if defined(__CUDA_ARCH__)
  return static_cast<float>(__dmul_rn(sigma, __dadd_rn(eps, __dmul_rn(s, centred))));
#else
  return static_cast<float>(sigma * (eps + s * centred));
#endif
}

// ---- Eq. 2 backward of one group ----------------------------------------------------------------
// Given dL/dY [8] (= dL/dW̃ under the STE of Eq. 3), Y = Z ⊙ V:
//   dV = dY ⊙ Z,  dZ = dY ⊙ V,  dπ_p = Σ_j dZ_j ρ_p[j],  dA = (κ/τ)·π ⊙ (dπ − ⟨π, dπ⟩).
// scale = (κ/τ) rounded to T. da may be null (support fixed). dv: [8]; da: [6].
template <typename T>
MOESQ_GS_HD void soft_group_backward(const T* dy, const T* v, const T* z, const T* pi, T scale, T* da, T* dv) {
  for (int j = 0; j < kGroup; ++j) dv[j] = dy[j] * z[j];
  if (!da) return;
  T pair[4];
  for (int q = 0; q < 4; ++q) pair[q] = dy[2 * q] * v[2 * q] + dy[2 * q + 1] * v[2 * q + 1];
  T dpi[kNumPatterns];
  T dot = 0;
  for (int p = 0; p < kNumPatterns; ++p) {
    dpi[p] = pair[pattern_pair(p, 0)] + pair[pattern_pair(p, 1)];
    dot += pi[p] * dpi[p];
  }
  for (int p = 0; p < kNumPatterns; ++p) da[p] = scale * pi[p] * (dpi[p] - dot);
}

// ---- Lion (Chen et al. 2023, Alg. 2, decoupled weight decay), one parameter -----------------------
//   c = β1·m + (1 − β1)·g;  θ ← θ − lr·sign(c) − lr·λ·θ;  m ← β2·m + (1 − β2)·g;  sign(0) = 0.
// step = lr, decay = lr·λ, both already rounded to fp32 by the caller.
MOESQ_GS_HD void lion_update(float& theta, float& m, float g, float b1, float b2, float step, float decay) {
  const float c = b1 * m + (1.0f - b1) * g;
  const float sign = static_cast<float>(int(c > 0.0f) - int(c < 0.0f));
  theta -= step * sign + decay * theta;
  m = b2 * m + (1.0f - b2) * g;
}

}  // namespace moesq::ops::gumbel
