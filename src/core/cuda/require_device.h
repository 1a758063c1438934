// require_cuda_device: the first thing a GPU path does. On a machine without a usable GPU the CUDA
// runtime's first call fails with a driver-level message ("CUDA driver version is insufficient for CUDA
// runtime version", "no CUDA-capable device is detected") that reads like a bug of moesq; this turns it
// into an error that says what is missing and what to use instead, before any weights are read.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace moesq {

// Error unless the CUDA runtime sees at least one device. `what`: the user-facing name of the path
// ("--device cuda", "bench e2e", "moesq.Engine"). Clears the sticky error the failed query leaves.
inline void require_cuda_device(const std::string& what) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaSuccess && n > 0) return;
  (void)cudaGetLastError();
  MOESQ_FAIL(what, ": no CUDA device found (", e == cudaSuccess ? "the runtime sees 0 devices" : cudaGetErrorString(e),
             "); the GPU engine needs an NVIDIA Hopper GPU (sm_90a: H100 / H200) and its driver. "
             "Use --device cpu for the reference forward on this machine");
}

}  // namespace moesq
