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

// The calling thread's context (created on first use, on the device use_gpu chose; Error on a CUDA /
// library failure).
ThreadContext& thread_context();

// An fp32 operand split into TF32 parts (ops/split_tf32: x ≈ hi + lo, both TF32-exact), kept in
// scratch so an operand used many times (an expert's weights) is split once.
struct SplitOperand {
  Scratch<float> hi_s, lo_s;
  const float* hi = nullptr;
  const float* lo = nullptr;
  // Splits n values of x (device) on t's stream.
  void split(ThreadContext& t, const float* x, size_t n);
};

// C = op(A)·op(B) + beta·C in cuBLAS's column-major convention (cublasSgemm's arguments), at fp32-class
// accuracy on TF32 tensor cores ("3xTF32"): C = beta·C + A_lo·B_hi, then + A_hi·B_lo, then + A_hi·B_hi
// (each product of TF32-exact parts is exact in the fp32 accumulator; the dropped A_lo·B_lo and the
// rounding of the lo parts are ≤ 2⁻²¹ of a product, against 2⁻²⁴ per fp32 product and ~√K·2⁻²⁴ of
// an fp32 SIMT GEMM's summation). Deterministic for a given shape (cuBLAS's kernel choice). Leaves
// t.blas in CUBLAS_PEDANTIC_MATH (the compression stages' fp32 mode). Errors: cuBLAS's, naming the call.
void sgemm_3xtf32(ThreadContext& t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                  const SplitOperand& A, int lda, const SplitOperand& B, int ldb, float beta, float* C, int ldc);

// Row-major C [m, N] = A [m, K] · Bᵀ + beta·C (B [N, K], already split: a layer's weights) as the
// column-major Cᵀ = B · Aᵀ, 3xTF32; A (device) is split into `a_split` first.
void sgemm_rows_nt(ThreadContext& t, SplitOperand& a_split, const float* A, int64_t m, int64_t K,
                   const SplitOperand& B, int64_t N, float* C, float beta);

}  // namespace moesq::compress::gpu
