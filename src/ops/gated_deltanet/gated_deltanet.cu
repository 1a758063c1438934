// Gated DeltaNet kernels (gated_deltanet.h):
//  - gdn_conv: one thread per (run, channel), its Kc-tap window in registers, walking the run's tokens
//    (coalesced along the channels), the slot's window written back after the run;
//  - gdn_recurrence: one CTA per (value head, run), S [dk, dv] in registers — thread (g, j) holds rows
//    32g..32g+31 of column j — walking the run's tokens; warp 0 does the per-token norms and gates.
// Both are latency-bound at decode (one token per run). The parallel form (prefill, gated_deltanet.h)
// gives the same bits with every token's independent work at once:
//  - gdn_conv_parallel_kernel: one thread per (token, channel), its Kc inputs from the run or the slot's
//    window; then gdn_conv_window_kernel moves each (run, channel)'s window on;
//  - gdn_prep_kernel: a CTA per token — q̂, k̂ of each key head by a warp, α, β of each value head;
//  - gdn_scan_kernel: a CTA per (32-column block of S, value head, run), thread (g, j) as in the walk;
//    the next token's q̂ | k̂, v columns and α, β copied into shared memory (cp.async, two buffers)
//    while this one is computed; three barriers a token (the walk has six); raw o written over v;
//  - gdn_norm_kernel: a warp per (token, value head), the gated RMSNorm.
// (The chunked WY form of the FLA kernels would parallelize a run over its tokens too, at other bits.)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

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

// The recurrence's outputs at `at`: y in fp32 and / or as bf16 hi + lo.
__device__ __forceinline__ void store_out(const GdnRecurrenceArgs& a, int64_t at, float y) {
  if (a.out) a.out[at] = y;
  if (a.out_hi) {
    const uint16_t hi = to_bf16(y);
    a.out_hi[at] = hi;
    if (a.out_lo) a.out_lo[at] = to_bf16(__fsub_rn(y, from_bf16(hi)));
  }
}

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
      store_out(a, t * Vd + static_cast<int64_t>(h) * dv + j, y);
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

// ---- the parallel form --------------------------------------------------------------------------

// The run of token t: the last r with run_start[r] ≤ t (empty runs share their start with the next).
__device__ __forceinline__ int run_of_token(const int32_t* start, int runs, int64_t t) {
  int lo = 0, hi = runs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (start[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Input u (= t − (Kc−1) + j) of a run starting at t0: the run's own, or the slot's window before it.
template <int KC>
__device__ __forceinline__ float conv_input(const GdnConvArgs& a, const float* win, int64_t u, int64_t t0, int c) {
  return u >= t0 ? a.x[u * a.ldx + c] : win[KC - 1 + (u - t0)];
}

// grid (T, ⌈C / 128⌉): the walk's fma chain over the same inputs, token by token independently.
template <int KC>
__global__ void __launch_bounds__(kConvThreads) gdn_conv_parallel_kernel(GdnConvArgs a) {
  const int64_t t = blockIdx.x;
  const int c = blockIdx.y * kConvThreads + threadIdx.x;
  if (c >= a.C) return;
  const int r = run_of_token(a.runs.run_start, a.runs.runs, t);
  const int64_t t0 = a.runs.run_start[r];
  const float* win = KC > 1 ? a.window + (static_cast<int64_t>(a.runs.run_slot[r]) * a.C + c) * (KC - 1) : nullptr;
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < KC; ++j) acc = fmaf(a.w[static_cast<int64_t>(c) * KC + j], conv_input<KC>(a, win, t - (KC - 1) + j, t0, c), acc);
  a.out[t * a.C + c] = silu(acc);
}

// grid (⌈C / 128⌉, runs): the window after the run = its last Kc−1 inputs (the old window's where the run is shorter).
template <int KC>
__global__ void __launch_bounds__(kConvThreads) gdn_conv_window_kernel(GdnConvArgs a) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x, r = blockIdx.y;
  if (c >= a.C) return;
  const int64_t t0 = a.runs.run_start[r], t1 = a.runs.run_start[r + 1];
  float* win = a.window + (static_cast<int64_t>(a.runs.run_slot[r]) * a.C + c) * (KC - 1);
  float next[KC - 1];
#pragma unroll
  for (int j = 0; j < KC - 1; ++j) next[j] = conv_input<KC>(a, win, t1 - (KC - 1) + j, t0, c);
#pragma unroll
  for (int j = 0; j < KC - 1; ++j) win[j] = next[j];
}

__device__ __forceinline__ void cp_async16(float* smem, const float* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(float* smem, const float* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

constexpr int kPrepThreads = 128, kNormThreads = 128;

// grid (T): the walk's warp-0 work of each token — q̂, k̂ over q, k (a warp per key head), α, β over a, b.
__global__ void __launch_bounds__(kPrepThreads) gdn_prep_kernel(GdnRecurrenceArgs a) {
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, dk = a.dk;
  const int64_t Kd = static_cast<int64_t>(a.nk) * dk, ld = 2 * Kd + static_cast<int64_t>(a.nv) * a.dv;
  float* row = const_cast<float*>(a.qkv) + t * ld;  // consume_inputs
  const float qscale = 1.0f / sqrtf(static_cast<float>(dk));
  for (int kh = warp; kh < a.nk; kh += kPrepThreads / 32) {
    float* q = row + static_cast<int64_t>(kh) * dk;
    float* k = q + Kd;
    const float iq = 1.0f / sqrtf(__fadd_rn(warp_sum_sq<float>(q, dk, lane), 1e-6f));
    const float ik = 1.0f / sqrtf(__fadd_rn(warp_sum_sq<float>(k, dk, lane), 1e-6f));
    __syncwarp();
    for (int i = lane; i < dk; i += 32) q[i] = __fmul_rn(__fmul_rn(q[i], iq), qscale), k[i] = __fmul_rn(k[i], ik);
  }
  for (int h = threadIdx.x; h < a.nv; h += kPrepThreads) {
    const float A = expf(a.A_log[h]);
    float* ap = const_cast<float*>(a.a) + t * a.ldz + h;
    float* bp = const_cast<float*>(a.b) + t * a.ldz + h;
    const float alpha = expf(__fmul_rn(-A, softplus(__fadd_rn(*ap, a.dt_bias[h]))));
    const float beta = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-*bp)));
    *ap = alpha, *bp = beta;
  }
}

// grid (dv / 32, nv, runs), 32·G threads: columns [32·blockIdx.x, +32) of value head h's S walked over
// the run, thread (g, j) holding rows 32g..32g+31 of column j as in the walk; raw o over v.
template <int G>
__global__ void __launch_bounds__(256) gdn_scan_kernel(GdnRecurrenceArgs a) {
  constexpr int dk = 32 * G;
  __shared__ __align__(16) float qk[2][2 * dk];  // q̂ | k̂ of a token, two buffers
  __shared__ __align__(16) float vv[2][32];      // the block's v columns
  __shared__ float ab[2][2];                     // α, β
  __shared__ float partA[G][32], partB[G][32];
  const int tid = threadIdx.x, jj = tid & 31, g = tid >> 5;
  const int c0 = blockIdx.x * 32, h = blockIdx.y, r = blockIdx.z, j = c0 + jj;
  const int nv = a.nv, dv = a.dv, kh = h / (nv / a.nk);
  const int64_t Kd = static_cast<int64_t>(a.nk) * dk, ld = 2 * Kd + static_cast<int64_t>(nv) * dv;
  float* qkv = const_cast<float*>(a.qkv);  // consume_inputs: o goes over v
  float* S = a.S + (static_cast<int64_t>(a.runs.run_slot[r]) * nv + h) * dk * dv;
  float s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = S[static_cast<int64_t>(32 * g + i) * dv + j];
  const int64_t t0 = a.runs.run_start[r], t1 = a.runs.run_start[r + 1];
  auto fetch = [&](int64_t t, int buf) {
    const float* row = qkv + t * ld;
    for (int i = tid; i < dk / 4; i += 32 * G) {
      cp_async16(&qk[buf][4 * i], row + static_cast<int64_t>(kh) * dk + 4 * i);
      cp_async16(&qk[buf][dk + 4 * i], row + Kd + static_cast<int64_t>(kh) * dk + 4 * i);
    }
    if (tid < 8) cp_async16(&vv[buf][4 * tid], row + 2 * Kd + static_cast<int64_t>(h) * dv + c0 + 4 * tid);
    if (tid == 8) cp_async4(&ab[buf][0], a.a + t * a.ldz + h);
    if (tid == 9) cp_async4(&ab[buf][1], a.b + t * a.ldz + h);
    cp_async_commit();
  };
  if (t0 < t1) fetch(t0, 0);
  for (int64_t t = t0; t < t1; ++t) {
    const int buf = static_cast<int>((t - t0) & 1);
    if (t + 1 < t1) {
      fetch(t + 1, buf ^ 1);  // its buffer was last read before the previous token's third barrier
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const float alpha = ab[buf][0], beta = ab[buf][1];
    const float* q = qk[buf];
    const float* k = qk[buf] + dk;
    float p = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] = __fmul_rn(s[i], alpha);
      p = fmaf(s[i], k[32 * g + i], p);
    }
    partA[g][jj] = p;
    __syncthreads();
    float mem = partA[0][jj];
    for (int g2 = 1; g2 < G; ++g2) mem = __fadd_rn(mem, partA[g2][jj]);
    const float delta = __fmul_rn(__fsub_rn(vv[buf][jj], mem), beta);
    p = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      s[i] = fmaf(k[32 * g + i], delta, s[i]);
      p = fmaf(s[i], q[32 * g + i], p);
    }
    partB[g][jj] = p;
    __syncthreads();
    if (g == 0) {
      float y = partB[0][jj];
      for (int g2 = 1; g2 < G; ++g2) y = __fadd_rn(y, partB[g2][jj]);
      qkv[t * ld + 2 * Kd + static_cast<int64_t>(h) * dv + j] = y;
    }
  }
  if (!a.update_state) return;
#pragma unroll
  for (int i = 0; i < 32; ++i) S[static_cast<int64_t>(32 * g + i) * dv + j] = s[i];
}

// grid (T, ⌈nv / 4⌉): a warp per (token, value head), the walk's gated RMSNorm of the raw o (over v).
__global__ void __launch_bounds__(kNormThreads) gdn_norm_kernel(GdnRecurrenceArgs a) {
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, h = blockIdx.y * (kNormThreads / 32) + (threadIdx.x >> 5);
  if (h >= a.nv) return;
  const int dv = a.dv;
  const int64_t Kd = static_cast<int64_t>(a.nk) * a.dk, ld = 2 * Kd + static_cast<int64_t>(a.nv) * dv,
                Vd = static_cast<int64_t>(a.nv) * dv;
  const float* o = a.qkv + t * ld + 2 * Kd + static_cast<int64_t>(h) * dv;
  const double ss = warp_sum_sq<double>(o, dv, lane);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(dv) + a.eps));
  for (int j = lane; j < dv; j += 32) {
    const float zj = a.z[t * a.ldz + static_cast<int64_t>(h) * dv + j];
    const float y = __fmul_rn(__fmul_rn(a.norm[j], __fmul_rn(o[j], inv)), silu(zj));
    store_out(a, t * Vd + static_cast<int64_t>(h) * dv + j, y);
  }
}

template <int KC>
void launch_conv_parallel(const GdnConvArgs& a, cudaStream_t stream) {
  const unsigned cblocks = static_cast<unsigned>((a.C + kConvThreads - 1) / kConvThreads);
  gdn_conv_parallel_kernel<KC><<<dim3(static_cast<unsigned>(a.tokens), cblocks), kConvThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gdn_conv_parallel_kernel");
  if (KC == 1 || !a.update_state) return;
  constexpr int kWindowKc = KC > 1 ? KC : 2;  // (KC = 1 has no window and returned above)
  gdn_conv_window_kernel<kWindowKc><<<dim3(cblocks, a.runs.runs), kConvThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gdn_conv_window_kernel");
}

template <int G>
void launch_recurrence_parallel(const GdnRecurrenceArgs& a, cudaStream_t stream) {
  const unsigned T = static_cast<unsigned>(a.tokens);
  gdn_prep_kernel<<<T, kPrepThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gdn_prep_kernel");
  gdn_scan_kernel<G><<<dim3(a.dv / 32, a.nv, a.runs.runs), 32 * G, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gdn_scan_kernel");
  gdn_norm_kernel<<<dim3(T, (a.nv + kNormThreads / 32 - 1) / (kNormThreads / 32)), kNormThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gdn_norm_kernel");
}

template <int G>
void launch_recurrence(const GdnRecurrenceArgs& a, cudaStream_t stream) {
  const size_t smem = sizeof(float) * (2 * 32 * G + static_cast<size_t>(G + 1) * a.dv + 4);
  const dim3 grid(a.nv, a.runs.runs);
  gdn_recurrence_kernel<G><<<grid, G * a.dv, smem, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("gdn_recurrence_kernel");
}

// fn(std::integral_constant<int, Kc>) for the built conv kernels 1..kGdnMaxConvKernel.
template <typename Fn>
void with_conv_kernel(int Kc, Fn&& fn) {
  switch (Kc) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 6: return fn(std::integral_constant<int, 6>{});
    case 7: return fn(std::integral_constant<int, 7>{});
    default: return fn(std::integral_constant<int, 8>{});
  }
}

}  // namespace

void gdn_conv(const GdnConvArgs& a, cudaStream_t stream) {
  gdn_conv_check(a);
  if (a.runs.runs == 0) return;
  const bool parallel = gdn_conv_parallel(a);
  if (parallel && a.tokens == 0) return;
  with_conv_kernel(a.Kc, [&](auto kc) {
    if (parallel) launch_conv_parallel<decltype(kc)::value>(a, stream);
    else launch_conv<decltype(kc)::value>(a, stream);
  });
}

void gdn_recurrence(const GdnRecurrenceArgs& a, cudaStream_t stream) {
  gdn_recurrence_check(a);
  if (a.runs.runs == 0) return;
  if (gdn_recurrence_parallel(a)) {
    switch (a.dk) {
      case 32: return launch_recurrence_parallel<1>(a, stream);
      case 64: return launch_recurrence_parallel<2>(a, stream);
      case 128: return launch_recurrence_parallel<4>(a, stream);
      default: return launch_recurrence_parallel<8>(a, stream);
    }
  }
  switch (a.dk) {
    case 32: return launch_recurrence<1>(a, stream);
    case 64: return launch_recurrence<2>(a, stream);
    case 128: return launch_recurrence<4>(a, stream);
    default: return launch_recurrence<8>(a, stream);
  }
}

}  // namespace moesq::ops
