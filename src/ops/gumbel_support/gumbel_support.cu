// Kernels of the gumbel_support launchers (gumbel_support.h): one thread per group of 8 weights, the
// per-group code of gumbel_math.h (shared with the CPU twins), vectorized 32-byte loads of V / W.
#include "core/cuda/check.cuh"
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

__global__ void __launch_bounds__(kThreads) forward_kernel(GumbelSupportArgs a) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (r >= a.R) return;
  float v[kGroup], z[kGroup], av[kNumPatterns], g[kNumPatterns], pi[kNumPatterns];
  load8(a.V + r * kGroup, v);
  if (a.mode != SupportMode::kFixed)
    for (int p = 0; p < kNumPatterns; ++p) av[p] = a.A[r * kNumPatterns + p];
  if (a.mode == SupportMode::kGumbel || a.mode == SupportMode::kNoiseFree) {
    if (a.mode == SupportMode::kGumbel)
      for (int p = 0; p < kNumPatterns; ++p) g[p] = rng_gumbel(a.key, static_cast<uint64_t>(r * kNumPatterns + p));
    soft_group_forward<float>(av, a.mode == SupportMode::kGumbel ? g : nullptr, a.kappa, a.tau, pi, z);
    for (int p = 0; p < kNumPatterns; ++p) a.pi[r * kNumPatterns + p] = pi[p];
  } else {
    const int p = a.mode == SupportMode::kArgmax ? argmax_pattern<float>(av) : min(static_cast<int>(a.fixed[r]), kNumPatterns - 1);
    if (a.mode == SupportMode::kArgmax && a.patterns) a.patterns[r] = static_cast<uint8_t>(p);
    z_of_pattern<float>(p, z);
  }
  float w[kGroup];
  for (int j = 0; j < kGroup; ++j) w[j] = z[j] * v[j];
  store8(a.W + r * kGroup, w);
}

__global__ void __launch_bounds__(kThreads) lion_kernel(GumbelSupportLionArgs a, float scale, float b1, float b2,
                                                        float step_A, float decay_A, float step_V, float decay_V) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (r >= a.R) return;
  const bool relaxed = a.pi != nullptr;
  float z[kGroup], pi[kNumPatterns], da[kNumPatterns], dv[kGroup], v[kGroup], dw[kGroup], mv[kGroup];
  if (relaxed) {
    for (int p = 0; p < kNumPatterns; ++p) pi[p] = a.pi[r * kNumPatterns + p];
    z_from_pi<float>(pi, z);
  } else {
    z_of_pattern<float>(min(static_cast<int>(a.fixed[r]), kNumPatterns - 1), z);
  }
  load8(a.V + r * kGroup, v);
  load8(a.dW + r * kGroup, dw);
  load8(a.mom_V + r * kGroup, mv);
  soft_group_backward<float>(dw, v, z, relaxed ? pi : nullptr, scale, relaxed ? da : nullptr, dv);
  if (relaxed)
    for (int p = 0; p < kNumPatterns; ++p)
      lion_update(a.A[r * kNumPatterns + p], a.mom_A[r * kNumPatterns + p], da[p], b1, b2, step_A, decay_A);
  for (int j = 0; j < kGroup; ++j) lion_update(v[j], mv[j], dv[j], b1, b2, step_V, decay_V);
  store8(a.V + r * kGroup, v);
  store8(a.mom_V + r * kGroup, mv);
}

unsigned blocks_for(int64_t R) { return static_cast<unsigned>((R + kThreads - 1) / kThreads); }

}  // namespace

void gumbel_support_forward(const GumbelSupportArgs& a, cudaStream_t stream) {
  gumbel_support_check(a);
  if (a.R == 0) return;
  forward_kernel<<<blocks_for(a.R), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gumbel_support_forward");
}

void gumbel_support_lion(const GumbelSupportLionArgs& a, cudaStream_t stream) {
  gumbel_support_check(a);
  if (a.R == 0) return;
  lion_kernel<<<blocks_for(a.R), kThreads, 0, stream>>>(
      a, static_cast<float>(a.kappa / a.tau), static_cast<float>(a.beta1), static_cast<float>(a.beta2),
      static_cast<float>(a.lr_A), static_cast<float>(a.lr_A * a.weight_decay), static_cast<float>(a.lr_V),
      static_cast<float>(a.lr_V * a.weight_decay));
  MOESQ_CUDA_LAUNCH_CHECK("gumbel_support_lion");
}

}  // namespace moesq::ops
