// Shared by the GPU benchmark programs (bench/*.cu): the cuBLAS status check and the CUDA-event timer.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/error.h"

#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    cublasStatus_t st_ = (call);                                                            \
    MOESQ_CHECK(st_ == CUBLAS_STATUS_SUCCESS, #call, " failed: cublas status ", int(st_)); \
  } while (0)

namespace moesq::bench {

// Median microseconds of fn(rep) on stream s over `reps` timed runs (CUDA events), after 5 warm-up runs.
template <typename F>
double median_us(F&& fn, int reps, cudaStream_t s) {
  cudaEvent_t a, b;
  MOESQ_CUDA_CHECK(cudaEventCreate(&a));
  MOESQ_CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) fn(i);
  MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    MOESQ_CUDA_CHECK(cudaEventRecord(a, s));
    fn(i);
    MOESQ_CUDA_CHECK(cudaEventRecord(b, s));
    MOESQ_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    MOESQ_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace moesq::bench
