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
  // Host ↔ device copies of pageable host memory through the thread's two pinned staging buffers
  // (kStageBytes each, double-buffered: the CPU fills one while the DMA engine drains the other), on
  // `stream`. Pageable copies from 16 threads serialize in the driver's own staging and reach a few
  // GB/s in all; these reach the DMA rate. h2d returns once `src` may be reused (the device copy is
  // stream-ordered); d2h returns once `dst` holds the data (it waits for the stream).
  void h2d(void* dst, const void* src, size_t bytes);
  void d2h(void* dst, const void* src, size_t bytes);
  static constexpr size_t kStageBytes = size_t{8} << 20;

 private:
  void* pinned_[2] = {nullptr, nullptr};
  cudaEvent_t drained_[2] = {nullptr, nullptr};  // the last copy out of / into pinned_[b] is done
  bool pending_[2] = {false, false};
  void wait(int b);
};

// The calling thread's context (created on first use; Error on a CUDA / library failure).
ThreadContext& thread_context();

}  // namespace moesq::compress::gpu
