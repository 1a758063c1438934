// Kernels of the gumbel_support launchers (gumbel_support.h): one thread per group of 8 weights, the
// per-group code of gumbel_math.h (shared with the CPU twins), vectorized 32-byte loads of V / W.
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/error.h"
#include "ops/gumbel_support/gumbel_math.h"
#include "ops/gumbel_support/gumbel_support.h"

namespace moesq::ops {

namespace {

using namespace gumbel;

constexpr int kThreads = 256;

__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__device__ __forceinline__ void store8(float* p, const float (&x)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
}

// The 6 logits / probabilities of group r: 24 bytes at an 8-byte-aligned address, as three 8-byte
// accesses (scalar 4-byte accesses at a 24-byte stride cost twice the load/store instructions).
__device__ __forceinline__ void load6(const float* p, float (&x)[6]) {
  const float2* q = reinterpret_cast<const float2*>(p);
  const float2 a = q[0], b = q[1], c = q[2];
  x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y, x[4] = c.x, x[5] = c.y;
}
__device__ __forceinline__ void store6(float* p, const float (&x)[6]) {
  float2* q = reinterpret_cast<float2*>(p);
  q[0] = make_float2(x[0], x[1]);
  q[1] = make_float2(x[2], x[3]);
  q[2] = make_float2(x[4], x[5]);
}

// The group's |W| max folded into *amax (one atomic per warp; fp32 bits of values >= 0 order like
// unsigned ints, so the max is exact and order-free), and the non-finite flag. Every lane of the warp
// calls it (lanes past R with w = 0).
__device__ __forceinline__ void fold_amax(const float (&w)[kGroup], float* amax, int32_t* nonfinite) {
  float m = 0.0f;
  bool bad = false;
  for (int j = 0; j < kGroup; ++j) {
    m = fmaxf(m, fabsf(w[j]));
    bad = bad || !isfinite(w[j]);
  }
  if (nonfinite && __any_sync(0xffffffffu, bad) && (threadIdx.x % 32) == 0) *nonfinite = 1;
  if (!amax) return;
  const unsigned warp_max = __reduce_max_sync(0xffffffffu, __float_as_uint(m));
  if ((threadIdx.x % 32) == 0 && warp_max) atomicMax(reinterpret_cast<unsigned*>(amax), warp_max);
}

// Up to kMaxProjections launches of one op in one grid: projection j owns blocks
// [first_block[j], first_block[j + 1]), so every block works on one projection (no divergence), and the
// per-group code is the single launch's — the same bits.
constexpr int kMaxProjections = 3;
template <typename Args>
struct Multi {
  Args a[kMaxProjections];
  unsigned first_block[kMaxProjections + 1] = {};
  int n = 0;
  // The projection of this block and the block's first group.
  __device__ __forceinline__ int which(int64_t* r0) const {
    int j = 0;
    while (j + 1 < n && blockIdx.x >= first_block[j + 1]) ++j;
    *r0 = static_cast<int64_t>(blockIdx.x - first_block[j]) * kThreads;
    return j;
  }
};

__device__ __forceinline__ void forward_groups(const GumbelSupportArgs& a, int64_t r) {
  float w[kGroup] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (r < a.R) {  // no early return: fold_amax's warp reduction needs every lane
    float v[kGroup], z[kGroup], av[kNumPatterns], g[kNumPatterns], pi[kNumPatterns];
    load8(a.V + r * kGroup, v);
    if (a.mode != SupportMode::kFixed) load6(a.A + r * kNumPatterns, av);
    if (a.mode == SupportMode::kGumbel || a.mode == SupportMode::kNoiseFree) {
      if (a.mode == SupportMode::kGumbel)
        for (int p = 0; p < kNumPatterns; ++p) g[p] = rng_gumbel(a.key, static_cast<uint64_t>(r * kNumPatterns + p));
      soft_group_forward<float>(av, a.mode == SupportMode::kGumbel ? g : nullptr, a.kappa, a.tau, pi, z);
      if (a.pi) store6(a.pi + r * kNumPatterns, pi);
    } else {
      const int p = a.mode == SupportMode::kArgmax ? argmax_pattern<float>(av)
                                                   : min(static_cast<int>(a.fixed[r]), kNumPatterns - 1);
      if (a.mode == SupportMode::kArgmax && a.patterns) a.patterns[r] = static_cast<uint8_t>(p);
      z_of_pattern<float>(p, z);
    }
    for (int j = 0; j < kGroup; ++j) w[j] = z[j] * v[j];
    store8(a.W + r * kGroup, w);
  }
  if (a.amax || a.nonfinite) fold_amax(w, a.amax, a.nonfinite);
}

__global__ void __launch_bounds__(kThreads) forward_kernel(Multi<GumbelSupportArgs> m) {
  int64_t r0 = 0;
  const int j = m.which(&r0);
  forward_groups(m.a[j], r0 + threadIdx.x);
}

// Lion's fp32 scalars of one launch (the launcher rounds them from the fp64 arguments once).
struct LionScalars {
  float scale, b1, b2, step_A, decay_A, step_V, decay_V;
};
LionScalars lion_scalars(const GumbelSupportLionArgs& a) {
  return {static_cast<float>(a.kappa / a.tau), static_cast<float>(a.beta1), static_cast<float>(a.beta2),
          static_cast<float>(a.lr_A), static_cast<float>(a.lr_A * a.weight_decay), static_cast<float>(a.lr_V),
          static_cast<float>(a.lr_V * a.weight_decay)};
}

__device__ __forceinline__ void lion_groups(const GumbelSupportLionArgs& a, const LionScalars& c, int64_t r) {
  if (r >= a.R) return;
  const float scale = c.scale, b1 = c.b1, b2 = c.b2, step_A = c.step_A, decay_A = c.decay_A, step_V = c.step_V,
              decay_V = c.decay_V;
  const bool relaxed = a.pi != nullptr || a.recompute_pi;
  float z[kGroup], pi[kNumPatterns], da[kNumPatterns], dv[kGroup], v[kGroup], dw[kGroup], mv[kGroup];
  float A[kNumPatterns];
  if (relaxed) load6(a.A + r * kNumPatterns, A);
  if (a.recompute_pi) {  // the forward's kGumbel π and Z of this group (A not yet updated): the same bits
    float g[kNumPatterns];
    for (int p = 0; p < kNumPatterns; ++p) g[p] = rng_gumbel(a.key, static_cast<uint64_t>(r * kNumPatterns + p));
    soft_group_forward<float>(A, g, a.kappa, a.tau, pi, z);
  } else if (relaxed) {
    load6(a.pi + r * kNumPatterns, pi);
    z_from_pi<float>(pi, z);
  } else {
    z_of_pattern<float>(min(static_cast<int>(a.fixed[r]), kNumPatterns - 1), z);
  }
  load8(a.V + r * kGroup, v);
  load8(a.dW + r * kGroup, dw);
  load8(a.mom_V + r * kGroup, mv);
  soft_group_backward<float>(dw, v, z, relaxed ? pi : nullptr, scale, relaxed ? da : nullptr, dv);
  if (relaxed) {
    float mA[kNumPatterns];
    load6(a.mom_A + r * kNumPatterns, mA);
    for (int p = 0; p < kNumPatterns; ++p) lion_update(A[p], mA[p], da[p], b1, b2, step_A, decay_A);
    store6(a.A + r * kNumPatterns, A);
    store6(a.mom_A + r * kNumPatterns, mA);
  }
  for (int j = 0; j < kGroup; ++j) lion_update(v[j], mv[j], dv[j], b1, b2, step_V, decay_V);
  store8(a.V + r * kGroup, v);
  store8(a.mom_V + r * kGroup, mv);
}

struct LionMulti {
  Multi<GumbelSupportLionArgs> m;
  LionScalars c[kMaxProjections];
};
__global__ void __launch_bounds__(kThreads) lion_kernel(LionMulti l) {
  int64_t r0 = 0;
  const int j = l.m.which(&r0);
  lion_groups(l.m.a[j], l.c[j], r0 + threadIdx.x);
}

// One thread per logit (6 per group): the Box–Muller draw is the cost, so no thread waits on another's.
__global__ void __launch_bounds__(kThreads) prior_kernel(GumbelPriorArgs a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= a.R * kNumPatterns) return;
  const int prior = min(static_cast<int>(a.prior[i / kNumPatterns]), kNumPatterns - 1);
  a.A[i] = prior_logit(prior, static_cast<int>(i % kNumPatterns), a.sigma, a.s, a.key, static_cast<uint64_t>(i));
}

bool aligned(const void* p, uintptr_t a) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % a == 0; }
void check_alignment(const char* op, const void* const* vec8, int n8, const void* const* vec6, int n6) {
  for (int i = 0; i < n8; ++i)
    MOESQ_CHECK(aligned(vec8[i], 16), op, ": the [R, 8] arrays (V, W, dW, mom_V) must be 16-byte aligned");
  for (int i = 0; i < n6; ++i)
    MOESQ_CHECK(aligned(vec6[i], 8), op, ": the [R, 6] arrays (A, pi, mom_A) must be 8-byte aligned");
}

unsigned blocks_for(int64_t R) { return static_cast<unsigned>((R + kThreads - 1) / kThreads); }

}  // namespace

void gumbel_support_forward(const GumbelSupportArgs* a, int n, cudaStream_t stream) {
  MOESQ_CHECK(n >= 1 && n <= kMaxProjections, "gumbel_support_forward: ", n, " projections (1 to 3 in one launch)");
  Multi<GumbelSupportArgs> m;
  m.n = n;
  for (int j = 0; j < n; ++j) {
    gumbel_support_check(a[j]);
    const void* v8[] = {a[j].V, a[j].W};
    const void* v6[] = {a[j].A, a[j].pi};
    check_alignment("gumbel_support_forward", v8, 2, v6, 2);
    m.a[j] = a[j];
    m.first_block[j + 1] = m.first_block[j] + blocks_for(a[j].R);
  }
  if (m.first_block[n] == 0) return;
  forward_kernel<<<m.first_block[n], kThreads, 0, stream>>>(m);
  MOESQ_CUDA_LAUNCH_CHECK("gumbel_support_forward");
}
void gumbel_support_forward(const GumbelSupportArgs& a, cudaStream_t stream) { gumbel_support_forward(&a, 1, stream); }

void gumbel_support_lion(const GumbelSupportLionArgs* a, int n, cudaStream_t stream) {
  MOESQ_CHECK(n >= 1 && n <= kMaxProjections, "gumbel_support_lion: ", n, " projections (1 to 3 in one launch)");
  LionMulti l;
  l.m.n = n;
  for (int j = 0; j < n; ++j) {
    gumbel_support_check(a[j]);
    const void* v8[] = {a[j].V, a[j].dW, a[j].mom_V};
    const void* v6[] = {a[j].A, a[j].pi, a[j].mom_A};
    check_alignment("gumbel_support_lion", v8, 3, v6, 3);
    l.m.a[j] = a[j];
    l.c[j] = lion_scalars(a[j]);
    l.m.first_block[j + 1] = l.m.first_block[j] + blocks_for(a[j].R);
  }
  if (l.m.first_block[n] == 0) return;
  lion_kernel<<<l.m.first_block[n], kThreads, 0, stream>>>(l);
  MOESQ_CUDA_LAUNCH_CHECK("gumbel_support_lion");
}
void gumbel_support_lion(const GumbelSupportLionArgs& a, cudaStream_t stream) { gumbel_support_lion(&a, 1, stream); }

void gumbel_prior_logits(const GumbelPriorArgs& a, cudaStream_t stream) {
  gumbel_support_check(a);
  if (a.R == 0) return;
  prior_kernel<<<blocks_for(a.R * kNumPatterns), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gumbel_prior_logits");
}

}  // namespace moesq::ops
