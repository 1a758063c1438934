// Measured peak of the tensor-core instruction the grouped sparse GEMM's compute-bound kernel is built
// on, so that bench/NOTES.md can state its compute floor from a measurement rather than a datasheet:
// wgmma.mma_async.sp m64nNk32 (2:4 sparse A from registers, B from 128-byte-swizzled shared memory,
// fp32 accumulation) against the dense wgmma.mma_async m64nNk16 of the same form, N ∈ {128, 256},
// 1 or 2 warpgroups per SM, one CTA per SM, one K block of wgmma in flight per warpgroup (wait_group
// 1, as in sparse_gemm_wgmma.cu). No global memory traffic and no decode: the ceiling of the
// instruction itself. Prints a table and writes JSON (--out). TFLOP/s are dense-equivalent
// (2·64·N·32 per sparse instruction, 2·64·N·16 per dense one).
#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "ops/sparse_gemm/wgmma.cuh"

namespace {

using namespace moesq::ops::detail;

template <bool kSparse, int kN>
__global__ void __launch_bounds__(256, 1) peak_kernel(int iters, float* sink) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  // B: [kN rows][128 B]; any finite bf16 values (the rate does not depend on them).
  for (uint32_t i = threadIdx.x; i < kN * 32u; i += blockDim.x)
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(base + 4 * i), "r"(0x3f803f80u) : "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
  const uint32_t meta = 0x44444444u;  // pairs {0, 1} in every 4-group
  const uint64_t desc = desc_k_major_sw128(base);
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
    if constexpr (kSparse) {
      Wgmma<kN>::mma(acc, a, desc, meta, 1);
      Wgmma<kN>::mma(acc, a, desc + (64 >> 4), meta, 1);
    } else {
      WgmmaDense<kN>::mma(acc, a, desc, 1);
      WgmmaDense<kN>::mma(acc, a, desc + (32 >> 4), 1);
    }
    wgmma_commit();
    wgmma_wait<1>();
  }
  wgmma_wait<0>();
  fence_acc(acc);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) s += acc[i];
  if (s == 12345.0f) sink[threadIdx.x] = s;  // keeps the loop alive; never true for these inputs
}

template <bool kSparse, int kN>
double run(int warpgroups, int sms, int iters, float* sink, nlohmann::json& rows) {
  const int smem = kN * 128 + 1024;
  MOESQ_CUDA_CHECK(cudaFuncSetAttribute(peak_kernel<kSparse, kN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t e0, e1;
  MOESQ_CUDA_CHECK(cudaEventCreate(&e0));
  MOESQ_CUDA_CHECK(cudaEventCreate(&e1));
  peak_kernel<kSparse, kN><<<sms, 128 * warpgroups, smem>>>(iters / 10, sink);  // warm-up
  MOESQ_CUDA_CHECK(cudaEventRecord(e0));
  peak_kernel<kSparse, kN><<<sms, 128 * warpgroups, smem>>>(iters, sink);
  MOESQ_CUDA_CHECK(cudaEventRecord(e1));
  MOESQ_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  MOESQ_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const double flops = 2.0 * 64 * kN * (kSparse ? 32 : 16) * 2.0 * iters * warpgroups * sms;
  const double tflops = flops / (ms * 1e-3) / 1e12;
  std::printf("%-6s m64n%dk%d  %d warpgroup(s)/SM  %8.3f ms  %7.1f TFLOP/s (dense-equivalent)\n",
              kSparse ? "sparse" : "dense", kN, kSparse ? 32 : 16, warpgroups, ms, tflops);
  rows.push_back({{"instruction", std::string(kSparse ? "wgmma.sp m64n" : "wgmma m64n") + std::to_string(kN) +
                                      (kSparse ? "k32" : "k16")},
                  {"warpgroups_per_sm", warpgroups},
                  {"ms", ms},
                  {"tflops_dense_equiv", tflops}});
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return tflops;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string out_path = "bench_wgmma_peak.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: bench_wgmma_peak [--out FILE.json]   (default bench_wgmma_peak.json)\n");
      return 0;
    }
    if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else MOESQ_FAIL("unknown argument or missing value: ", a, " (usage: bench_wgmma_peak [--out FILE.json])");
  }
  cudaDeviceProp prop;
  MOESQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  moesq::DevBuf<float> sink_buf(256);  // [256] written only if the loop's value were ever 12345
  float* sink = sink_buf.p;
  nlohmann::json rows = nlohmann::json::array();
  const int iters = 200000, sms = prop.multiProcessorCount;
  for (int wg : {1, 2}) {
    run<false, 128>(wg, sms, iters, sink, rows);
    run<false, 256>(wg, sms, iters, sink, rows);
    run<true, 128>(wg, sms, iters, sink, rows);
    run<true, 256>(wg, sms, iters, sink, rows);
  }
  std::ofstream(out_path) << nlohmann::json({{"device", prop.name}, {"sms", sms}, {"rows", rows}}).dump(1) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_wgmma_peak: %s\n", e.what());
  return 1;
}
