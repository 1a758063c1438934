// Test helper: an owning device buffer of n elements (cudaMalloc/cudaFree), filled from and read back
// to host vectors. CUDA errors throw moesq::Error (cuda/cuda_check.cuh).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "cuda/cuda_check.cuh"

namespace moesq::test {

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { MOESQ_CUDA_CHECK(cudaMalloc(&p, sizeof(T) * std::max<size_t>(n, 1))); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { upload(h); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& h) {
    MOESQ_CUDA_CHECK(cudaMemcpy(p, h.data(), sizeof(T) * h.size(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    MOESQ_CUDA_CHECK(cudaMemcpy(h.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace moesq::test
