// Probe for the next small-M GEMM design (bench/NOTES.md, session 29): does a bf16 tensor-core product
// keep its bits when the operands of mma.m16n8k16 trade places? gemm_bf16's batch invariance rests on
// ONE reduction order — per output element a chain of k16 MMAs, hi then lo, from zero — and every
// kernel (tile, small-M, large-M) runs it through wmma m16n16k16 with the activations x as A and the
// weights W as B. A decode GEMM (M ≤ 16 tokens) would stream W with more bytes in flight with W as the
// A operand (16 weight rows × k16) and the tokens as n8, straight from registers — but only if an
// element's bits are the same. This program measures it on random data that stresses the alignment of
// the 16 products (bf16 values scaled by 2^[-12, 12], cancelling signs, hi + lo rows as the engine's):
//   ref:     wmma m16n16k16, A = x (16 × 16, row), B = Wᵀ (col), hi then lo per k16 — the kernels' chain;
//   x_as_a:  mma.sync m16n8k16 row.col, A = x, B = Wᵀ (two n8 halves): does wmma lower to these?
//   w_as_a:  mma.sync m16n8k16, A = W (16 weight rows), B = xᵀ (8 tokens): the operands swapped.
// For each it prints the elements whose fp32 bits differ from ref (of 16 × 16 per trial, or 16 × 8 for
// w_as_a) and exits 0; it asserts nothing, a fact of the hardware is what it reports.
//   build/probe_mma_order [--trials 200] [--k 2048]
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdio>
#include <vector>

#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "ops/gemm_bf16/mma_bf16.cuh"
#include "probe_common.cuh"

namespace {

using moesq::DevBuf;
using moesq::ops::detail::mma_bf16;
using moesq::probe::bits;
using moesq::probe::pair;

// The reference chain: wmma m16n16k16 as gemm_bf16's kernels issue it. x, xl: [16, K]; w: [16, K]; out [16, 16].
__global__ void ref_kernel(const uint16_t* x, const uint16_t* xl, const uint16_t* w, int K, float* out) {
  using namespace nvcuda;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int k0 = 0; k0 < K; k0 += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::load_matrix_sync(fb, reinterpret_cast<const __nv_bfloat16*>(w + k0), K);
    wmma::load_matrix_sync(fa, reinterpret_cast<const __nv_bfloat16*>(x + k0), K);
    wmma::mma_sync(acc, fa, fb, acc);
    wmma::load_matrix_sync(fa, reinterpret_cast<const __nv_bfloat16*>(xl + k0), K);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

// A fragment of rows [16] of a row-major [16, K] matrix at k0 (PTX ISA, mma.m16n8k16 .bf16 A layout).
__device__ __forceinline__ void load_a(const uint16_t* m, int K, int k0, int lane, uint32_t (&a)[4]) {
  moesq::probe::load_a(m, K, 0, k0, lane, a);
}
// B fragment (k16 × n8, "col") whose column n is row n0 + n of a row-major [·, K] matrix.
__device__ __forceinline__ void load_b(const uint16_t* m, int K, int n0, int k0, int lane, uint32_t& b0, uint32_t& b1) {
  const int g = lane >> 2, t = lane & 3;
  b0 = pair(m + (n0 + g) * K + k0 + 2 * t);
  b1 = pair(m + (n0 + g) * K + k0 + 8 + 2 * t);
}

// x as A, Wᵀ as B, two n8 halves: out [16 tokens, 16 columns] row-major.
__global__ void x_as_a_kernel(const uint16_t* x, const uint16_t* xl, const uint16_t* w, int K, float* out) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  float d[2][4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[4], al[4];
    load_a(x, K, k0, lane, a);
    load_a(xl, K, k0, lane, al);
    for (int h = 0; h < 2; ++h) {
      uint32_t b0, b1;
      load_b(w, K, 8 * h, k0, lane, b0, b1);
      mma_bf16(d[h], a, b0, b1);
      mma_bf16(d[h], al, b0, b1);
    }
  }
  for (int h = 0; h < 2; ++h) {
    out[g * 16 + 8 * h + 2 * t] = d[h][0], out[g * 16 + 8 * h + 2 * t + 1] = d[h][1];
    out[(g + 8) * 16 + 8 * h + 2 * t] = d[h][2], out[(g + 8) * 16 + 8 * h + 2 * t + 1] = d[h][3];
  }
}

// W as A (16 weight rows), xᵀ as B (tokens 0..7): out [16 tokens, 16 columns] row-major, tokens < 8.
__global__ void w_as_a_kernel(const uint16_t* x, const uint16_t* xl, const uint16_t* w, int K, float* out) {
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  float d[4] = {};
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[4], b0, b1, l0, l1;
    load_a(w, K, k0, lane, a);
    load_b(x, K, 0, k0, lane, b0, b1);
    load_b(xl, K, 0, k0, lane, l0, l1);
    mma_bf16(d, a, b0, b1);
    mma_bf16(d, a, l0, l1);
  }
  // d[0], d[1]: weight row g, tokens 2t, 2t+1; d[2], d[3]: weight row g + 8.
  out[(2 * t) * 16 + g] = d[0], out[(2 * t + 1) * 16 + g] = d[1];
  out[(2 * t) * 16 + g + 8] = d[2], out[(2 * t + 1) * 16 + g + 8] = d[3];
}

}  // namespace

int main(int argc, char** argv) {
  moesq::probe::ProbeArgs args;
  args.trials = 200;
  if (!moesq::probe::parse_probe_args(argc, argv, "probe_mma_order", args)) return 2;
  const int trials = args.trials, K = args.K;
  moesq::probe::ProbeRng rng(2029);
  int64_t diff_x = 0, diff_w = 0, n_x = 0, n_w = 0;
  for (int tr = 0; tr < trials; ++tr) {
    const int rows = 1 + tr % 16;  // decode-sized: the rows past `rows` are zero, as in the kernels
    std::vector<uint16_t> x(16 * K, 0), xl(16 * K, 0), w(16 * K);
    rng.tokens(x, xl, rows, K);
    rng.weights(w);
    DevBuf<uint16_t> dx(x), dxl(xl), dw(w);
    DevBuf<float> o_ref(256), o_x(256), o_w(std::vector<float>(256, 0.0f));
    ref_kernel<<<1, 32>>>(dx.p, dxl.p, dw.p, K, o_ref.p);
    x_as_a_kernel<<<1, 32>>>(dx.p, dxl.p, dw.p, K, o_x.p);
    w_as_a_kernel<<<1, 32>>>(dx.p, dxl.p, dw.p, K, o_w.p);
    MOESQ_CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> r = o_ref.download(), a = o_x.download(), b = o_w.download();
    for (int i = 0; i < 256; ++i) {
      diff_x += bits(a[i]) != bits(r[i]), ++n_x;
      if (i / 16 < 8) diff_w += bits(b[i]) != bits(r[i]), ++n_w;
    }
  }
  std::printf("probe_mma_order: K = %d, %d trials (1..16 nonzero token rows, hi + lo)\n", K, trials);
  std::printf("  x_as_a (mma.m16n8k16, x as A) vs wmma m16n16k16: %lld of %lld elements differ\n",
              static_cast<long long>(diff_x), static_cast<long long>(n_x));
  std::printf("  w_as_a (mma.m16n8k16, W as A, tokens as n8) vs wmma: %lld of %lld elements differ\n",
              static_cast<long long>(diff_w), static_cast<long long>(n_w));
  return 0;
}
