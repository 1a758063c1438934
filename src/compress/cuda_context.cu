// The per-thread stream and handles of the GPU compression stages (compress/cuda_context.cuh).
#include "compress/cuda_context.cuh"

namespace moesq::compress::gpu {

ThreadContext::ThreadContext() {
  MOESQ_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  MOESQ_CUBLAS_CHECK(cublasCreate(&blas));
  MOESQ_CUBLAS_CHECK(cublasSetStream(blas, stream));
  MOESQ_CUSOLVER_CHECK(cusolverDnCreate(&solver));
  MOESQ_CUSOLVER_CHECK(cusolverDnSetStream(solver, stream));
}

ThreadContext::~ThreadContext() {
  if (solver) cusolverDnDestroy(solver);
  if (blas) cublasDestroy(blas);
  if (stream) cudaStreamDestroy(stream);
}

ThreadContext& thread_context() {
  thread_local ThreadContext ctx;
  return ctx;
}

}  // namespace moesq::compress::gpu
