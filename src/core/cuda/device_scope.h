// Scoped CUDA state for host code that runs on a caller's device and stream (runtime::MoeLayerGpu, the
// Python module's GPU ops): DeviceScope makes a device current and restores the caller's on exit;
// StreamScratch is one stream-ordered allocation (cudaMallocAsync) freed on the same stream
// (cudaFreeAsync) when the scope ends — work already enqueued on the stream still sees it, later work
// on the stream may reuse it, and the host never waits.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "core/cuda/check.cuh"

namespace moesq {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    MOESQ_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) {
      MOESQ_CUDA_CHECK(cudaSetDevice(device));
      switched_ = true;
    }
  }
  ~DeviceScope() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

class StreamScratch {
 public:
  StreamScratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    MOESQ_CUDA_CHECK(cudaMallocAsync(&base_, std::max<size_t>(bytes, 1), stream));
  }
  ~StreamScratch() { cudaFreeAsync(base_, stream_); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  void* get() const { return base_; }

 private:
  void* base_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace moesq
