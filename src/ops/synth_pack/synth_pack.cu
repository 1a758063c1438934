// Synthetic weight kernels (synth_pack.h): one thread per output element / byte, grid-stride.
#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "format/kernel_layout.h"
#include "ops/synth_pack/synth_pack.h"

namespace moesq::ops {

static_assert(format::kChunkBytes == 1408 && format::kChunkCodeBytes == 1024 && format::kChunkScaleBytes == 128,
              "synth_sparse_byte hard-codes the kernel-layout chunk: codes, scales, metadata");

namespace {

__global__ void synth_bf16_kernel(SynthBf16Args a) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = static_cast<float>(synth_hash(a.seed, static_cast<uint64_t>(a.first + i)) >> 40) * (1.0f / 16777216.0f);
    // The twin's expression, rounded as written (no fma).
    const float v = __fadd_rn(a.mean, __fmul_rn(a.scale, __fmul_rn(1.7320508f, __fsub_rn(__fmul_rn(2.0f, u), 1.0f))));
    a.out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

__global__ void synth_sparse_kernel(SynthSparseArgs a) {
  const int64_t n = a.num_chunks * 1408;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    a.out[i] = synth_sparse_byte(a.seed, a.first + i / 1408, static_cast<int>(i % 1408));
}

}  // namespace

void synth_bf16(const SynthBf16Args& a, cudaStream_t stream) {
  MOESQ_CHECK(a.n >= 0 && a.first >= 0, "synth_bf16: n=", a.n, " first=", a.first);
  if (a.n == 0) return;
  synth_bf16_kernel<<<4096, 256, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("synth_bf16_kernel");
}

void synth_sparse48_kl(const SynthSparseArgs& a, cudaStream_t stream) {
  MOESQ_CHECK(a.num_chunks >= 0 && a.first >= 0, "synth_sparse48_kl: num_chunks=", a.num_chunks, " first=", a.first);
  if (a.num_chunks == 0) return;
  synth_sparse_kernel<<<4096, 256, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("synth_sparse_kernel");
}

}  // namespace moesq::ops
