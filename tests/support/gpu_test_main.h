// main() of the gpu-labelled test programs: a machine without a CUDA device is an error (exit 1 with
// a message), never a silent pass — these programs only run where a GPU is expected.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdio>

namespace moesq::test {

inline int gpu_test_main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "no CUDA device: GPU tests need one\n");
    return 1;
  }
  return RUN_ALL_TESTS();
}

}  // namespace moesq::test
