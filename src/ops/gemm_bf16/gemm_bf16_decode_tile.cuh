// Internal to ops/gemm_bf16: what the decode path's two kernels share (gemm_bf16_decode.cu's mma.sync
// kernel, gemm_bf16_decode_wg.cu's wgmma kernel): the CTA's tile (128 output columns, 64-wide K tiles),
// the padded token-row stride, and the epilogue — store the chains' values, or with split slices park
// them in shared memory and fold the cluster's slices in ascending order through distributed shared
// memory (gemm_bf16_decode.h).
#pragma once
#include <cooperative_groups.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/cuda/pdl.cuh"
#include "core/error.h"
#include "ops/gemm_bf16/gemm_bf16.h"
#include "ops/gemm_bf16/gemm_bf16_small_m.h"
#include "ops/gemm_bf16/mma_bf16.cuh"

namespace moesq::ops::detail {

constexpr int kDecodeBN = 128;                 // output columns (W rows) per CTA
constexpr int kDecodeBK = kGemmBlockK;         // K tile (64): the tile kernel's
constexpr int kDecodeLds = kDecodeBK + 8;      // bf16 stride of a staged token row (144 B: ldmatrix conflict-free)
constexpr int kDecodeVecRow = kDecodeBK / 8;   // 16-byte vectors per staged row
constexpr size_t kDecodeSmemTwoCtas = 113 * 1024;  // the shared memory that leaves room for a second CTA per SM
static_assert(kGemmSplitK % kDecodeBK == 0, "split slices hold whole K tiles");

// What a decode CTA works on: group g = blockIdx.z (its rows: counts[g] clamped to [0, M], or M), K
// slice blockIdx.y ([k_begin, k_end), the whole K without split_ws) in `tiles` K tiles, output columns
// n0 … n0 + 127 (blockIdx.x), and the group's x, x_lo (null without lo parts) and W.
struct DecodeCta {
  int g;
  int64_t rows;
  bool split;
  int64_t k_begin, k_end;
  int tiles;
  int64_t n0;
  const uint16_t *x, *xl, *w;
};
__device__ __forceinline__ DecodeCta decode_cta(const GemmBf16Args& a) {
  DecodeCta c;
  c.g = blockIdx.z;
  c.rows = a.counts ? min(max(a.counts[c.g], 0), static_cast<int>(a.M)) : a.M;
  c.split = a.split_ws != nullptr;
  c.k_begin = c.split ? static_cast<int64_t>(blockIdx.y) * kGemmSplitK : 0;
  c.k_end = c.split ? min(a.K, c.k_begin + kGemmSplitK) : a.K;
  c.tiles = static_cast<int>((c.k_end - c.k_begin + kDecodeBK - 1) / kDecodeBK);
  c.n0 = static_cast<int64_t>(blockIdx.x) * kDecodeBN;
  c.x = a.x + static_cast<int64_t>(c.g) * a.M * a.K;
  c.xl = a.x_lo ? a.x_lo + static_cast<int64_t>(c.g) * a.M * a.K : nullptr;
  c.w = a.w + static_cast<int64_t>(c.g) * a.N * a.K;
  return c;
}

// The chains' values out. acc(i, j, q): accumulator q (the mma m16n8 C fragment's) of the thread's token
// tile i (tiles mt0 + i, kMTW of them) and n8 tile j (kNT of them, columns col0 + 8·j …): token row
// (mt0 + i)·16 + lane/4 (+8 for q ≥ 2), column n0 + col0 + 8·j + 2·(lane % 4) + q % 2. Without split the
// values are stored (rows < rows, columns < N). With split: this slice's chains to shared memory
// smem [x_rows, kDecodeBN] fp32 (over the ring: every thread must be past its last read of it), then the
// cluster's CTAs fold slices 0, 1, … in order, CTA s taking elements s·kThreads + tid, … . Every thread of
// the CTA calls it.
template <int kMTW, int kNT, int kThreads, typename Acc>
__device__ __forceinline__ void decode_epilogue(const GemmBf16Args& a, int g, int64_t rows, int64_t n0, bool split,
                                                int mt0, int col0, int x_rows, unsigned char* smem, Acc acc) {
  const int tid = threadIdx.x, lane = tid % 32;
  if (!split) {
#pragma unroll
    for (int i = 0; i < kMTW; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = (mt0 + i) * 16 + lane / 4 + h * 8;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int64_t n = n0 + col0 + j * 8 + 2 * (lane % 4) + q;
            if (n < a.N) store_y(a, (static_cast<int64_t>(g) * a.M + r) * a.ldy + n, acc(i, j, 2 * h + q));
          }
      }
    return;
  }
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  __syncthreads();
  float* part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < kMTW; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int r = (mt0 + i) * 16 + lane / 4 + h * 8;
          if (r < x_rows) part[r * kDecodeBN + col0 + j * 8 + 2 * (lane % 4) + q] = acc(i, j, 2 * h + q);
        }
  cluster.sync();  // every slice's partial tile written and visible across the cluster
  const int slices = static_cast<int>(cluster.num_blocks()), me = static_cast<int>(cluster.block_rank());
  for (int64_t e = static_cast<int64_t>(me) * kThreads + tid; e < rows * kDecodeBN;
       e += static_cast<int64_t>(slices) * kThreads) {
    const int64_t r = e / kDecodeBN, n = n0 + e % kDecodeBN;
    if (n >= a.N) continue;
    float val = cluster.map_shared_rank(part, 0)[e];
    for (int s = 1; s < slices; ++s) val = __fadd_rn(val, cluster.map_shared_rank(part, s)[e]);  // slice order
    store_y(a, (static_cast<int64_t>(g) * a.M + r) * a.ldy + n, val);
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

// Launches a decode kernel (its dynamic shared memory already allowed): grid (128-column tiles, split
// slices, groups), the slices of a column tile one cluster, `threads` per CTA, and the W prefetch before
// the PDL wait (gemm_bf16_prefetch_bytes; its −1 taken as 0). Throws when N or the groups overflow the grid.
template <typename... Params>
void launch_decode_grid(const char* what, void (*kernel)(Params...), const GemmBf16Args& a, int threads, size_t smem,
                        cudaStream_t stream) {
  const int slices = gemm_bf16_chain_slices(a);
  const int64_t ntiles = (a.N + kDecodeBN - 1) / kDecodeBN;
  MOESQ_CHECK(ntiles <= 0x7fffffff && a.groups <= 65535, "gemm_bf16: N=", a.N, " or G=", a.groups, " too large");
  const dim3 grid(static_cast<unsigned>(ntiles), static_cast<unsigned>(slices), static_cast<unsigned>(a.groups));
  const int64_t prefetch = std::max<int64_t>(gemm_bf16_prefetch_bytes(a), 0);
  launch_pdl_cluster(what, kernel, grid, dim3(1, static_cast<unsigned>(slices), 1), dim3(threads), smem, stream, a,
                     prefetch);
}

}  // namespace moesq::ops::detail
