// Probe for the decode GEMM at 64 tokens (bench/NOTES.md, session 32): does wgmma keep gemm_bf16's bits?
// gemm_bf16's batch invariance rests on ONE reduction order per output element — a chain of k16 MMAs,
// hi then lo per k16 step, from zero — run today by mma.sync m16n8k16 (the decode path, 2.7 GFLOP per
// q|k|v call at M = 64 with hi + lo, at mma.sync's rate). wgmma.mma_async m64n128k16 with the 64 tokens
// as A (registers: each warp its m16 fragment, as for mma.sync) and 128 weight rows as B (shared memory,
// 128-byte swizzle) issues the same chain per element at the warpgroup rate — only if its k16 step adds
// to the fp32 accumulator with mma.sync's bits. This program measures that on random data stressing the
// alignment of the 16 products (bf16 scaled by 2^[-12, 12], cancelling signs, hi + lo token rows, 1..64
// of them nonzero as in decode):
//   ref:   mma.sync m16n8k16 per warp (token tile) and n8 tile, hi then lo per k16 — the decode path's chain;
//   wgmma: one warpgroup, wgmma m64n128k16 twice per k16 (hi, then lo), the same A fragments.
// It prints the elements whose fp32 bits differ (of 64 × 128 per trial) and exits 0; it asserts nothing.
//   build/probe_wgmma_order [--trials 50] [--k 2048]
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "ops/gemm_bf16/mma_bf16.cuh"
#include "ops/sparse_gemm/wgmma.cuh"
#include "probe_common.cuh"

namespace {

using moesq::DevBuf;
using moesq::ops::detail::mma_bf16;
using moesq::probe::bits;
using moesq::probe::load_a;
using moesq::probe::pair;
namespace d = moesq::ops::detail;

constexpr int kTok = 64, kN = 128;

// The decode path's chain: warp w owns tokens 16w .. 16w + 15, all 16 n8 tiles. out [64, 128] row-major.
__global__ void ref_kernel(const uint16_t* x, const uint16_t* xl, const uint16_t* w, int K, float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  float acc[kN / 8][4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[4], al[4];
    load_a(x, K, 16 * warp, k0, lane, a);
    load_a(xl, K, 16 * warp, k0, lane, al);
    for (int j = 0; j < kN / 8; ++j) {
      const uint32_t b0 = pair(w + (8 * j + g) * K + k0 + 2 * t), b1 = pair(w + (8 * j + g) * K + k0 + 8 + 2 * t);
      mma_bf16(acc[j], a, b0, b1);
      mma_bf16(acc[j], al, b0, b1);
    }
  }
  for (int j = 0; j < kN / 8; ++j) {
    const int r = 16 * warp + g, c = 8 * j + 2 * t;
    out[r * kN + c] = acc[j][0], out[r * kN + c + 1] = acc[j][1];
    out[(r + 8) * kN + c] = acc[j][2], out[(r + 8) * kN + c + 1] = acc[j][3];
  }
}

// One warpgroup: W's 64-wide K tile staged K-major with the 128-byte swizzle (row n at n·128 B, its
// 16-byte chunk c at chunk c ^ (n % 8)), then per k16 step wgmma(hi) and wgmma(lo) into one accumulator.
__global__ void __launch_bounds__(128) wgmma_kernel(const uint16_t* x, const uint16_t* xl, const uint16_t* w, int K,
                                                    float* out) {
  __shared__ __align__(1024) unsigned char sw[kN * 128];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const uint32_t base = d::smem_addr(sw);
  float acc[64];
  for (float& v : acc) v = 0.0f;
  for (int k0 = 0; k0 < K; k0 += 64) {
    __syncthreads();  // the previous tile's wgmma retired (wait<0> below) in every warp
    for (int v = threadIdx.x; v < kN * 8; v += 128) {
      const int n = v / 8, c = v % 8;
      const bool in = k0 + 8 * c < K;
      const uint4 val = in ? *reinterpret_cast<const uint4*>(w + n * K + k0 + 8 * c) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(sw + n * 128 + ((c ^ (n & 7)) << 4)) = val;
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic-proxy stores → wgmma's reads
    __syncthreads();
    const uint64_t desc = d::desc_k_major_sw128(base);
    for (int kk = 0; kk < 64 && k0 + kk < K; kk += 16) {
      uint32_t a[4], al[4];
      load_a(x, K, 16 * warp, k0 + kk, lane, a);
      load_a(xl, K, 16 * warp, k0 + kk, lane, al);
      d::wgmma_fence();
      d::WgmmaDense<kN>::mma(acc, a, desc + ((kk * 2) >> 4), 1);  // + 32 B per k16 inside the 128-B row
      d::WgmmaDense<kN>::mma(acc, al, desc + ((kk * 2) >> 4), 1);
      d::wgmma_commit();
      d::wgmma_wait<0>();
      d::fence_acc(acc);
    }
  }
  for (int j = 0; j < kN / 8; ++j) {
    const int r = 16 * warp + g, c = 8 * j + 2 * t;
    out[r * kN + c] = acc[4 * j], out[r * kN + c + 1] = acc[4 * j + 1];
    out[(r + 8) * kN + c] = acc[4 * j + 2], out[(r + 8) * kN + c + 1] = acc[4 * j + 3];
  }
}

}  // namespace

int main(int argc, char** argv) {
  moesq::probe::ProbeArgs args;
  args.trials = 50;
  if (!moesq::probe::parse_probe_args(argc, argv, "probe_wgmma_order", args)) return 2;
  const int trials = args.trials, K = args.K;
  moesq::probe::ProbeRng rng(2032);
  int64_t diff = 0, n = 0, first_tr = -1;
  float first_ref = 0, first_wg = 0;
  for (int tr = 0; tr < trials; ++tr) {
    const int rows = 1 + (tr * 13) % kTok;  // decode-sized: the rows past `rows` are zero, as in the kernels
    std::vector<uint16_t> x(kTok * K, 0), xl(kTok * K, 0), w(kN * K);
    rng.tokens(x, xl, rows, K);
    rng.weights(w);
    DevBuf<uint16_t> dx(x), dxl(xl), dw(w);
    DevBuf<float> o_ref(kTok * kN), o_wg(kTok * kN);
    ref_kernel<<<1, 128>>>(dx.p, dxl.p, dw.p, K, o_ref.p);
    wgmma_kernel<<<1, 128>>>(dx.p, dxl.p, dw.p, K, o_wg.p);
    MOESQ_CUDA_CHECK(cudaGetLastError());
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> r = o_ref.download(), a = o_wg.download();
    for (int i = 0; i < kTok * kN; ++i) {
      const bool differs = bits(a[i]) != bits(r[i]);
      if (differs && first_tr < 0) first_tr = tr, first_ref = r[i], first_wg = a[i];
      diff += differs, ++n;
    }
  }
  std::printf("probe_wgmma_order: K = %d, %d trials (1..64 nonzero token rows, hi + lo)\n", K, trials);
  std::printf("  wgmma m64n128k16 (tokens as A, W from swizzled smem) vs mma.sync m16n8k16: %lld of %lld elements differ\n",
              static_cast<long long>(diff), static_cast<long long>(n));
  if (first_tr >= 0)
    std::printf("  first difference (trial %lld): mma.sync %.9g, wgmma %.9g\n", static_cast<long long>(first_tr),
                first_ref, first_wg);
  return 0;
}
