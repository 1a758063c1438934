// Launcher: RMSNorm of fp32 rows (Qwen3RMSNorm, y = w · x / sqrt(mean(x²) + eps)) written as bf16
// (the next GEMM's input), and/or as fp32 (y_f32: compression's fp32 layer forward, compress/attention_cuda). Same arithmetic as model::rmsnorm_rows: the mean of squares accumulated
// in fp64, inv = (float)(1/sqrt(ss/D + eps)), y = w · (x · inv) in fp32, then rounded to bf16.
// CPU twin: rmsnorm_ref. The fp64 sum is a fixed-order tree over 256 threads (one row per CTA), so a
// row's bits never depend on other rows.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#else
typedef struct CUstream_st* cudaStream_t;
#endif

namespace moesq::ops {

struct RmsNormArgs {
  const float* x = nullptr;  // [n, D] fp32 rows
  const float* w = nullptr;  // [D] fp32 weight
  uint16_t* y = nullptr;     // [n, D] bf16 output, or nullptr when y_f32 is given
  uint16_t* y_lo = nullptr;  // [n, D] bf16 of the rounding residue (fp32 y − y), or nullptr
  float* y_f32 = nullptr;    // [n, D] fp32 output (the value before the bf16 rounding), or nullptr; may be x
  int64_t n = 0, D = 0;
  double eps = 1e-6;
};

void rmsnorm(const RmsNormArgs& args, cudaStream_t stream);
void rmsnorm_ref(const RmsNormArgs& args);  // host pointers; fp64 sum in the kernel's tree order

}  // namespace moesq::ops
