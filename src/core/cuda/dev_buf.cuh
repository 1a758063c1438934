// DevBuf: an owning device buffer of n elements (cudaMalloc/cudaFree), filled from and read back to
// host memory; CUDA errors throw moesq::Error (core/cuda/check.cuh). The one device-buffer type of the
// tests, benchmarks and host-side launcher wrappers. Non-obvious: an empty buffer still allocates one
// element, so a kernel argument is never nullptr merely because a batch is empty.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "core/cuda/check.cuh"

namespace moesq {

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) { MOESQ_CUDA_CHECK(cudaMalloc(&p, sizeof(T) * std::max<size_t>(n, 1))); }
  DevBuf(const T* host, size_t count) : DevBuf(count) { upload(host, count); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.data(), h.size()) {}
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const T* host, size_t count) {
    if (count) MOESQ_CUDA_CHECK(cudaMemcpy(p, host, sizeof(T) * count, cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& h) { upload(h.data(), h.size()); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (n) MOESQ_CUDA_CHECK(cudaMemcpy(h.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace moesq
