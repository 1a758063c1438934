// The per-thread stream and handles of the GPU compression stages (compress/cuda_context.cuh).
#include "compress/cuda_context.cuh"

#include <atomic>
#include <cstring>

#include "ops/split_tf32/split_tf32.h"

namespace moesq::compress {

namespace {
std::atomic<int> g_device{0};  // compress::use_gpu
}

void use_gpu(int ordinal) {
  int n = 0;
  MOESQ_CHECK(cudaGetDeviceCount(&n) == cudaSuccess && ordinal >= 0 && ordinal < n, "use_gpu: device ", ordinal,
              " outside the ", n, " visible GPUs");
  MOESQ_CUDA_CHECK(cudaSetDevice(ordinal));
  g_device.store(ordinal);
}

}  // namespace moesq::compress

namespace moesq::compress::gpu {

ThreadContext::ThreadContext() {
  // A worker thread's first CUDA call: its stream, handles and scratch live on the run's GPU.
  MOESQ_CUDA_CHECK(cudaSetDevice(g_device.load()));
  MOESQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  MOESQ_CUBLAS_CHECK(cublasCreate(&blas));
  MOESQ_CUBLAS_CHECK(cublasSetStream(blas, stream));
  MOESQ_CUSOLVER_CHECK(cusolverDnCreate(&solver));
  MOESQ_CUSOLVER_CHECK(cusolverDnSetStream(solver, stream));
  for (int b = 0; b < 2; ++b) {
    MOESQ_CUDA_CHECK(cudaHostAlloc(&pinned_[b], kStageBytes, cudaHostAllocDefault));
    MOESQ_CUDA_CHECK(cudaEventCreateWithFlags(&drained_[b], cudaEventDisableTiming));
  }
}

void ThreadContext::wait(int b) {
  if (pending_[b]) MOESQ_CUDA_CHECK(cudaEventSynchronize(drained_[b]));
  pending_[b] = false;
}

void ThreadContext::h2d(void* dst, const void* src, size_t bytes) {
  for (size_t off = 0, k = 0; off < bytes; off += kStageBytes, ++k) {
    const int b = static_cast<int>(k % 2);
    const size_t len = std::min(kStageBytes, bytes - off);
    wait(b);  // the DMA of this buffer's previous chunk is done
    std::memcpy(pinned_[b], static_cast<const char*>(src) + off, len);
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, pinned_[b], len, cudaMemcpyHostToDevice, stream));
    MOESQ_CUDA_CHECK(cudaEventRecord(drained_[b], stream));
    pending_[b] = true;
  }
}

void ThreadContext::d2h(void* dst, const void* src, size_t bytes) {
  const size_t chunks = (bytes + kStageBytes - 1) / kStageBytes;
  auto issue = [&](size_t k) {
    const int b = static_cast<int>(k % 2);
    wait(b);
    const size_t off = k * kStageBytes, len = std::min(kStageBytes, bytes - off);
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(pinned_[b], static_cast<const char*>(src) + off, len, cudaMemcpyDeviceToHost, stream));
    MOESQ_CUDA_CHECK(cudaEventRecord(drained_[b], stream));
    pending_[b] = true;
  };
  if (chunks > 0) issue(0);
  for (size_t k = 0; k < chunks; ++k) {
    if (k + 1 < chunks) issue(k + 1);  // the next chunk lands while this one is copied out
    const int b = static_cast<int>(k % 2);
    wait(b);
    const size_t off = k * kStageBytes, len = std::min(kStageBytes, bytes - off);
    std::memcpy(static_cast<char*>(dst) + off, pinned_[b], len);
  }
}

ThreadContext::~ThreadContext() {
  for (int b = 0; b < 2; ++b) {
    if (drained_[b]) cudaEventSynchronize(drained_[b]), cudaEventDestroy(drained_[b]);
    if (pinned_[b]) cudaFreeHost(pinned_[b]);
  }
  if (solver) cusolverDnDestroy(solver);
  if (blas) cublasDestroy(blas);
  if (stream) cudaStreamDestroy(stream);
}

void SplitOperand::split(ThreadContext& t, const float* x, size_t n) {
  float* h = hi_s.get(std::max<size_t>(n, 1));
  float* l = lo_s.get(std::max<size_t>(n, 1));
  ops::split_tf32({.x = x, .n = static_cast<int64_t>(n), .hi = h, .lo = l}, t.stream);
  hi = h;
  lo = l;
}

void sgemm_3xtf32(ThreadContext& t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                  const SplitOperand& A, int lda, const SplitOperand& B, int ldb, float beta, float* C, int ldc) {
  MOESQ_CHECK(A.hi && A.lo && B.hi && B.lo, "sgemm_3xtf32: an operand was not split");
  const float one = 1.0f;
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(t.blas, CUBLAS_TF32_TENSOR_OP_MATH));
  // The small terms first: the one rounding of the large term's add comes last.
  MOESQ_CUBLAS_CHECK(cublasSgemm(t.blas, ta, tb, m, n, k, &one, A.lo, lda, B.hi, ldb, &beta, C, ldc));
  MOESQ_CUBLAS_CHECK(cublasSgemm(t.blas, ta, tb, m, n, k, &one, A.hi, lda, B.lo, ldb, &one, C, ldc));
  MOESQ_CUBLAS_CHECK(cublasSgemm(t.blas, ta, tb, m, n, k, &one, A.hi, lda, B.hi, ldb, &one, C, ldc));
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(t.blas, CUBLAS_PEDANTIC_MATH));
}

void sgemm_rows_nt(ThreadContext& t, SplitOperand& a_split, const float* A, int64_t m, int64_t K,
                   const SplitOperand& B, int64_t N, float* C, float beta) {
  a_split.split(t, A, static_cast<size_t>(m * K));
  sgemm_3xtf32(t, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(m), static_cast<int>(K), B,
               static_cast<int>(K), a_split, static_cast<int>(K), beta, C, static_cast<int>(N));
}

ThreadContext& thread_context() {
  thread_local ThreadContext ctx;
  return ctx;
}

}  // namespace moesq::compress::gpu
