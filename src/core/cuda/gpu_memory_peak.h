// GpuMemoryPeak: the peak device memory in use while it lives, sampled from a background thread by
// cudaMemGetInfo every 10 ms (device-wide: every context and process on the GPU counts, so run it on
// an otherwise idle GPU). A sampled peak can miss an allocation shorter than the period.
// Used by `moesq bench compress` and bench_compress_layer. Header-only; needs the CUDA runtime.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "core/cuda/check.cuh"

namespace moesq {

class GpuMemoryPeak {
 public:
  GpuMemoryPeak() {
    MOESQ_CUDA_CHECK(cudaMemGetInfo(&free0_, &total_));
    min_free_ = free0_;
    thread_ = std::thread([this] {
      while (!done_) {
        size_t f = 0, t = 0;
        if (cudaMemGetInfo(&f, &t) == cudaSuccess && f < min_free_) min_free_ = f;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  ~GpuMemoryPeak() { stop(); }
  GpuMemoryPeak(const GpuMemoryPeak&) = delete;
  GpuMemoryPeak& operator=(const GpuMemoryPeak&) = delete;
  // Stops sampling (idempotent). GB = 1e9 bytes.
  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  double peak_in_use_gb() const { return static_cast<double>(total_ - min_free_) / 1e9; }  // device-wide
  double peak_added_gb() const { return static_cast<double>(free0_ - min_free_) / 1e9; }   // over the start

 private:
  size_t free0_ = 0, total_ = 0;
  std::atomic<size_t> min_free_{0};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace moesq
