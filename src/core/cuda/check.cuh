// CUDA error checks that throw moesq::Error naming the call and the CUDA error (DESIGN.md: errors
// name what failed). Host-only; included by the launcher .cu files, the GPU tests and the bench.
#pragma once
#include <cuda_runtime_api.h>

#include "core/error.h"

#define MOESQ_CUDA_CHECK(call)                                                                     \
  do {                                                                                             \
    cudaError_t moesq_err_ = (call);                                                               \
    MOESQ_CHECK(moesq_err_ == cudaSuccess, #call, " failed: ", cudaGetErrorString(moesq_err_), " (", \
                __FILE__, ":", __LINE__, ")");                                                     \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, execution errors at the next sync.
#define MOESQ_CUDA_LAUNCH_CHECK(what) MOESQ_CUDA_CHECK(cudaGetLastError())
