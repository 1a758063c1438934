// Kernels of the swiglu_train launchers (swiglu_train.h): elementwise over [rows, I]; the forward with
// Q_a is one CTA per row (the SwiGLU, then fake_quant's per-row pass on it in shared memory).
#include "core/cuda/check.cuh"
#include "ops/descale_rows/descale_rows.h"
#include "ops/fake_quant/fake_quant.h"
#include "ops/fake_quant/fake_quant_device.cuh"
#include "ops/swiglu_train/swiglu_train.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// row_gamma / gamma / ab_out: the fused descale (swiglu_train.h), null when ab is already descaled.
__global__ void __launch_bounds__(kThreads) forward_kernel(const float* ab, float* h, int64_t rows, int64_t I,
                                                           const float* row_gamma, const float* gamma, float* ab_out) {
  const int64_t n = rows * I;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / I, c = i % I;
    float x = ab[r * 2 * I + c], y = ab[r * 2 * I + I + c];
    if (gamma) {
      const float gr = row_gamma[r], g = *gamma;
      x = descale_value(x, gr, g);
      y = descale_value(y, gr, g);
      ab_out[r * 2 * I + c] = x;
      ab_out[r * 2 * I + I + c] = y;
    }
    h[i] = __fmul_rn(__fmul_rn(x, sigmoid_f(x)), y);
  }
}

// The forward with Q_a, one CTA per row: h of the row into shared memory (the same expression as
// forward_kernel), then the row's Q_a (fake_quant's per-row pass, fake_quant_device.cuh) from there —
// the same bits as forward_kernel followed by fake_quant's row_quant_kernel, one launch and no global
// round trip of the unquantized h. Dynamic shared memory: I floats.
__global__ void __launch_bounds__(kThreads) forward_quant_kernel(SwigluTrainArgs a) {
  extern __shared__ float s_h[];
  __shared__ float s_red[32];
  const int64_t r = blockIdx.x, I = a.I;
  const float* ab = a.ab + r * 2 * I;
  float* ab_out = a.ab_out ? a.ab_out + r * 2 * I : nullptr;
  const float gr = a.ab_gamma ? a.ab_row_gamma[r] : 1.0f, g = a.ab_gamma ? *a.ab_gamma : 1.0f;
  for (int64_t c = threadIdx.x; c < I; c += kThreads) {
    float x = ab[c], y = ab[I + c];
    if (a.ab_gamma) {
      x = descale_value(x, gr, g);
      y = descale_value(y, gr, g);
      ab_out[c] = x;
      ab_out[I + c] = y;
    }
    s_h[c] = __fmul_rn(__fmul_rn(x, sigmoid_f(x)), y);
  }
  __syncthreads();
  detail::quantize_row_q_a(s_h, a.h + r * I, I, a.block, a.nonfinite,
                           a.h_unscaled_bf16 ? a.h_unscaled_bf16 + r * I : nullptr, a.h_gamma ? a.h_gamma + r : nullptr,
                           s_red);
}

__global__ void __launch_bounds__(kThreads) backward_kernel(const float* ab, const float* dh, float* dab, int64_t rows,
                                                            int64_t I) {
  const int64_t n = rows * I;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r = i / I, c = i % I;
    const float a = ab[r * 2 * I + c], b = ab[r * 2 * I + I + c], s = sigmoid_f(a), g = dh[i];
    dab[r * 2 * I + c] = g * b * s * (1.0f + a * (1.0f - s));
    dab[r * 2 * I + I + c] = g * (a * s);
  }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535)); }

}  // namespace

void swiglu_train_forward(const SwigluTrainArgs& a, cudaStream_t stream) {
  swiglu_train_check(a, false);
  if (a.rows == 0) return;
  const size_t smem = sizeof(float) * static_cast<size_t>(a.I);
  if (a.quantize && smem <= 48 * 1024 && a.rows <= 0x7fffffff) {  // one launch: SwiGLU + Q_a per row
    forward_quant_kernel<<<static_cast<unsigned>(a.rows), kThreads, smem, stream>>>(a);
    MOESQ_CUDA_LAUNCH_CHECK("swiglu_train_forward (with Q_a)");
    return;
  }
  forward_kernel<<<blocks_for(a.rows * a.I), kThreads, 0, stream>>>(a.ab, a.h, a.rows, a.I, a.ab_row_gamma, a.ab_gamma,
                                                                    a.ab_out);
  MOESQ_CUDA_LAUNCH_CHECK("swiglu_train_forward");
  if (a.quantize)
    fake_quant({.x = a.h, .rows = a.rows, .K = a.I, .block = a.block, .per_row = true, .amax = nullptr,
                .nonfinite = a.nonfinite, .unscaled_bf16 = a.h_unscaled_bf16, .gamma = a.h_gamma},
               stream);
}

void swiglu_train_backward(const SwigluTrainArgs& a, cudaStream_t stream) {
  swiglu_train_check(a, true);
  if (a.rows == 0) return;
  backward_kernel<<<blocks_for(a.rows * a.I), kThreads, 0, stream>>>(a.ab, a.dh, a.dab, a.rows, a.I);
  MOESQ_CUDA_LAUNCH_CHECK("swiglu_train_backward");
}

}  // namespace moesq::ops
