// Gated DeltaNet kernels (gated_deltanet.h):
//  - gdn_conv: one thread per (run, channel), its Kc-tap window in registers, walking the run's tokens
//    (coalesced along the channels), the slot's window written back after the run;
//  - gdn_recurrence: one CTA per (value head, run), S [dk, dv] in registers — thread (g, j) holds rows
//    32g..32g+31 of column j — walking the run's tokens; warp 0 does the per-token norms and gates.
// Both are latency-bound at decode (one token per run); the prefill form is the same walk (v1: the
// chunked WY form of the FLA kernels would parallelize a long run over its tokens).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda/check.cuh"
#include "ops/gated_deltanet/gated_deltanet.h"

namespace moesq::ops {

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kConvThreads = 128;

__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ uint16_t to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float from_bf16(uint16_t h) { return __bfloat162float(__ushort_as_bfloat16(h)); }

template <int KC>
__global__ void __launch_bounds__(kConvThreads) gdn_conv_kernel(GdnConvArgs a) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x, r = blockIdx.y;
  if (c >= a.C) return;
  const int64_t t0 = a.runs.run_start[r], t1 = a.runs.run_start[r + 1];
  float* st = KC > 1 ? a.window + (static_cast<int64_t>(a.runs.run_slot[r]) * a.C + c) * (KC - 1) : nullptr;
  float w[KC], win[KC];
#pragma unroll
  for (int j = 0; j < KC; ++j) w[j] = a.w[static_cast<int64_t>(c) * KC + j];
#pragma unroll
  for (int j = 0; j < KC - 1; ++j) win[j] = st[j];
  for (int64_t t = t0; t < t1; ++t) {
    win[KC - 1] = a.x[t * a.ldx + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < KC; ++j) acc = fmaf(w[j], win[j], acc);
    a.out[t * a.C + c] = silu(acc);
#pragma unroll
    for (int j = 0; j + 1 < KC; ++j) win[j] = win[j + 1];
  }
  if (!a.update_state) return;
#pragma unroll
  for (int j = 0; j < KC - 1; ++j) st[j] = win[j];
}

// Σ v[i]² over n values in shared memory by one warp (lane sums, then the butterfly).
template <typename Acc>
__device__ Acc warp_sum_sq(const float* v, int n, int lane) {
  Acc s = 0;
  for (int i = lane; i < n; i += 32) s = fma(static_cast<Acc>(v[i]), static_cast<Acc>(v[i]), s);
  for (int h = 1; h < 32; h *= 2) s = s + __shfl_xor_sync(kFull, s, h);
  return s;
}

// G groups of 32 key rows; blockDim = G · dv ≤ 512 (32 S values per thread: ≤ 128 registers); shared: q, k [32G], part [G, dv], o [dv], 4 scalars.
template <int G>
__global__ void __launch_bounds__(512) gdn_recurrence_kernel(GdnRecurrenceArgs a) {
  constexpr int dk = 32 * G;
  extern __shared__ float sm[];
  const int dv = a.dv, h = blockIdx.x, r = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int j = tid % dv, g = tid / dv;
  float* q = sm;              // [dk]
  float* k = q + dk;          // [dk]
  float* part = k + dk;       // [G, dv]
  float* o = part + G * dv;   // [dv]
  float* scal = o + dv;       // alpha, beta, inv
  const int nv = a.nv, kh = h / (nv / a.nk);
  const int64_t Kd = static_cast<int64_t>(a.nk) * dk, ld = 2 * Kd + static_cast<int64_t>(nv) * dv,
                Vd = static_cast<int64_t>(nv) * dv;
  float* S = a.S + (static_cast<int64_t>(a.runs.run_slot[r]) * nv + h) * dk * dv;
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = S[static_cast<int64_t>(32 * g + i) * dv + j];
  const float qscale = 1.0f / sqrtf(static_cast<float>(dk));
  const float A = expf(a.A_log[h]);
  const int64_t t1 = a.runs.run_start[r + 1];
  for (int64_t t = a.runs.run_start[r]; t < t1; ++t) {
    const float* row = a.qkv + t * ld;
    for (int i = tid; i < dk; i += blockDim.x) q[i] = row[kh * dk + i], k[i] = row[Kd + kh * dk + i];
    __syncthreads();
    if (warp == 0) {
      const float iq = 1.0f / sqrtf(__fadd_rn(warp_sum_sq<float>(q, dk, lane), 1e-6f));
      const float ik = 1.0f / sqrtf(__fadd_rn(warp_sum_sq<float>(k, dk, lane), 1e-6f));
      __syncwarp();
      for (int i = lane; i < dk; i += 32) q[i] = __fmul_rn(__fmul_rn(q[i], iq), qscale), k[i] = __fmul_rn(k[i], ik);
      if (lane == 0) {
        scal[0] = expf(__fmul_rn(-A, softplus(__fadd_rn(a.a[t * a.ldz + h], a.dt_bias[h]))));
        scal[1] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-a.b[t * a.ldz + h])));
      }
    }
    __syncthreads();
    const float alpha = scal[0], beta = scal[1];
    float p = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] = __fmul_rn(s[i], alpha);
      p = fmaf(s[i], k[32 * g + i], p);
    }
    part[g * dv + j] = p;
    __syncthreads();
    float mem = part[j];
    for (int g2 = 1; g2 < G; ++g2) mem = __fadd_rn(mem, part[g2 * dv + j]);
    const float delta = __fmul_rn(__fsub_rn(row[2 * Kd + static_cast<int64_t>(h) * dv + j], mem), beta);
    __syncthreads();  // every column read its parts
    p = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] = fmaf(k[32 * g + i], delta, s[i]);
      p = fmaf(s[i], q[32 * g + i], p);
    }
    part[g * dv + j] = p;
    __syncthreads();
    if (g == 0) {
      float y = part[j];
      for (int g2 = 1; g2 < G; ++g2) y = __fadd_rn(y, part[g2 * dv + j]);
      o[j] = y;
    }
    __syncthreads();
    if (warp == 0) {
      const double ss = warp_sum_sq<double>(o, dv, lane);
      if (lane == 0) scal[2] = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(dv) + a.eps));
    }
    __syncthreads();
    if (g == 0) {
      const float zj = a.z[t * a.ldz + static_cast<int64_t>(h) * dv + j];
      const float y = __fmul_rn(__fmul_rn(a.norm[j], __fmul_rn(o[j], scal[2])), silu(zj));
      const int64_t at = t * Vd + static_cast<int64_t>(h) * dv + j;
      if (a.out) a.out[at] = y;
      if (a.out_hi) {
        const uint16_t hi = to_bf16(y);
        a.out_hi[at] = hi;
        if (a.out_lo) a.out_lo[at] = to_bf16(__fsub_rn(y, from_bf16(hi)));
      }
    }
    __syncthreads();  // q, k, o and the scalars are rewritten by the next token
  }
  if (!a.update_state) return;
#pragma unroll
  for (int i = 0; i < 32; ++i) S[static_cast<int64_t>(32 * g + i) * dv + j] = s[i];
}

template <int KC>
void launch_conv(const GdnConvArgs& a, cudaStream_t stream) {
  const dim3 grid((a.C + kConvThreads - 1) / kConvThreads, a.runs.runs);
  gdn_conv_kernel<KC><<<grid, kConvThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gdn_conv_kernel");
}

template <int G>
void launch_recurrence(const GdnRecurrenceArgs& a, cudaStream_t stream) {
  const size_t smem = sizeof(float) * (2 * 32 * G + static_cast<size_t>(G + 1) * a.dv + 4);
  const dim3 grid(a.nv, a.runs.runs);
  gdn_recurrence_kernel<G><<<grid, G * a.dv, smem, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gdn_recurrence_kernel");
}

}  // namespace

void gdn_conv(const GdnConvArgs& a, cudaStream_t stream) {
  gdn_conv_check(a);
  if (a.runs.runs == 0) return;
  switch (a.Kc) {
    case 1: return launch_conv<1>(a, stream);
    case 2: return launch_conv<2>(a, stream);
    case 3: return launch_conv<3>(a, stream);
    case 4: return launch_conv<4>(a, stream);
    case 5: return launch_conv<5>(a, stream);
    case 6: return launch_conv<6>(a, stream);
    case 7: return launch_conv<7>(a, stream);
    default: return launch_conv<8>(a, stream);
  }
}

void gdn_recurrence(const GdnRecurrenceArgs& a, cudaStream_t stream) {
  gdn_recurrence_check(a);
  if (a.runs.runs == 0) return;
  switch (a.dk) {
    case 32: return launch_recurrence<1>(a, stream);
    case 64: return launch_recurrence<2>(a, stream);
    case 128: return launch_recurrence<4>(a, stream);
    default: return launch_recurrence<8>(a, stream);
  }
}

}  // namespace moesq::ops
