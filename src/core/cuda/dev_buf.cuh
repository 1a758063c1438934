// DevBuf: an owning, movable device buffer of n elements (cudaMalloc/cudaFree: never managed memory),
// filled from and read back to host memory; CUDA errors throw moesq::Error (core/cuda/check.cuh). The
// one device-buffer type of the engine, the tests, the benchmarks and the host-side launcher wrappers.
// Non-obvious: an allocated buffer holds at least one element, so a kernel argument is never nullptr
// merely because a batch is empty; a default-constructed or moved-from buffer holds nothing (p == nullptr).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "core/cuda/check.cuh"

namespace moesq {

template <typename T>
struct DevBuf {
  T* p = nullptr;  // [n] device memory
  size_t n = 0;
  DevBuf() = default;
  explicit DevBuf(size_t count) { alloc(count); }
  DevBuf(const T* host, size_t count) : DevBuf(count) { upload(host, count); }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.data(), h.size()) {}
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(std::exchange(o.p, nullptr)), n(std::exchange(o.n, 0)) {}
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(n, o.n);
    return *this;
  }
  // Frees what it holds and allocates `count` elements (contents undefined).
  void alloc(size_t count) {
    if (p) cudaFree(std::exchange(p, nullptr));
    n = count;
    MOESQ_CUDA_CHECK(cudaMalloc(&p, sizeof(T) * std::max<size_t>(n, 1)));
  }
  // Copies count ≤ n host elements to the front of the buffer.
  void upload(const T* host, size_t count) {
    if (count) MOESQ_CUDA_CHECK(cudaMemcpy(p, host, sizeof(T) * count, cudaMemcpyHostToDevice));
  }
  // Copies count host elements, (re)allocating first when count differs from n (or nothing is held).
  void assign(const T* host, size_t count) {
    if (!p || count != n) alloc(count);
    upload(host, count);
  }
  // Copies h, reallocating first when its size differs from n.
  void upload(const std::vector<T>& h) {
    if (!p || h.size() != n) alloc(h.size());
    upload(h.data(), h.size());
  }
  std::vector<T> download() const {
    std::vector<T> h(n);
    if (n) MOESQ_CUDA_CHECK(cudaMemcpy(h.data(), p, sizeof(T) * n, cudaMemcpyDeviceToHost));
    return h;
  }
  size_t bytes() const { return sizeof(T) * n; }
};

}  // namespace moesq
