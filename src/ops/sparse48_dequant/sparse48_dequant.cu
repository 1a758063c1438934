// Kernel of the sparse48_dequant launcher (sparse48_dequant.h): one thread per group of 8 dense
// positions (2 value bytes, a metadata nibble, a quarter of a scale byte), two 16-byte stores.
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/error.h"
#include "ops/common/nvfp4_row.cuh"
#include "ops/sparse48_dequant/sparse48_dequant.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 256;

using detail::e2m1_decode;   // ops/common/nvfp4_row.cuh: the device codecs the quantizing kernels use
using detail::ue4m3_decode;

__global__ void __launch_bounds__(kThreads) dequant_kernel(Sparse48DequantArgs a) {
  const int64_t groups = a.N * (a.K / 8);
  const int64_t gi = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (gi >= groups) return;
  const int64_t G = a.K / 8, n = gi / G, g = gi % G;
  const unsigned nib = (a.meta[n * (a.K / 16) + g / 2] >> (4 * (g & 1))) & 15u;
  const unsigned i0 = nib & 3u, i1 = nib >> 2;
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (i0 < i1) {
    const float s = ue4m3_decode(a.scales[n * (a.K / 32) + g / 4]);
    const unsigned b0 = a.values[n * (a.K / 4) + 2 * g], b1 = a.values[n * (a.K / 4) + 2 * g + 1];
    // (dec(q) · s) / γ: the product is exact (≤ 6 significant bits), the division rounds once.
    v[2 * i0] = __fdiv_rn(__fmul_rn(e2m1_decode(b0 & 15u), s), a.global_scale);
    v[2 * i0 + 1] = __fdiv_rn(__fmul_rn(e2m1_decode(b0 >> 4), s), a.global_scale);
    v[2 * i1] = __fdiv_rn(__fmul_rn(e2m1_decode(b1 & 15u), s), a.global_scale);
    v[2 * i1 + 1] = __fdiv_rn(__fmul_rn(e2m1_decode(b1 >> 4), s), a.global_scale);
  }
  float4* o = reinterpret_cast<float4*>(a.out + gi * 8);
  o[0] = make_float4(v[0], v[1], v[2], v[3]);
  o[1] = make_float4(v[4], v[5], v[6], v[7]);
}

}  // namespace

void sparse48_dequant(const Sparse48DequantArgs& a, cudaStream_t stream) {
  sparse48_dequant_check(a);
  MOESQ_CHECK(reinterpret_cast<uintptr_t>(a.out) % 16 == 0, "sparse48_dequant: out must be 16-byte aligned");
  const int64_t groups = a.N * (a.K / 8);
  if (groups == 0) return;
  dequant_kernel<<<static_cast<unsigned>((groups + kThreads - 1) / kThreads), kThreads, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("sparse48_dequant");
}

}  // namespace moesq::ops
