// The GPU stages of compression (compress/sgptq_cuda.h, compress/expert_cuda.h,
// refine/cuda_step_backend.h) share one CUDA stream and one cuBLAS / cuSOLVER handle per worker
// thread: an expert's stages run on its thread in order, so they are ordered on that stream and
// never race on the thread's scratch. Scratch grows only (by at least a quarter), so the experts
// a thread solves reuse the memory of the largest seen so far: no cudaMalloc / cudaFree (which
// synchronizes the whole device) per expert.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"

#define MOESQ_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                             \
    const cublasStatus_t moesq_st_ = (call);                                                       \
    MOESQ_CHECK(moesq_st_ == CUBLAS_STATUS_SUCCESS, #call, " failed: cuBLAS status ",              \
                static_cast<int>(moesq_st_));                                                      \
  } while (0)
#define MOESQ_CUSOLVER_CHECK(call)                                                                 \
  do {                                                                                             \
    const cusolverStatus_t moesq_st_ = (call);                                                     \
    MOESQ_CHECK(moesq_st_ == CUSOLVER_STATUS_SUCCESS, #call, " failed: cuSOLVER status ",          \
                static_cast<int>(moesq_st_));                                                      \
  } while (0)

namespace moesq::compress::gpu {

// A device buffer that only grows; get(n) returns at least n elements (contents undefined).
template <typename T>
struct Scratch {
  DevBuf<T> b;
  T* get(size_t n) {
    if (!b.p || b.n < n) b.alloc(std::max(n, b.n + b.n / 4));
    return b.p;
  }
};

struct ThreadContext {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
  ThreadContext();
  ~ThreadContext();
  ThreadContext(const ThreadContext&) = delete;
  ThreadContext& operator=(const ThreadContext&) = delete;
  void sync() const { MOESQ_CUDA_CHECK(cudaStreamSynchronize(stream)); }
};

// The calling thread's context (created on first use; Error on a CUDA / library failure).
ThreadContext& thread_context();

}  // namespace moesq::compress::gpu
