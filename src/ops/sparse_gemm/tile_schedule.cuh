// Device-side tile schedule of the persistent grouped GEMM kernels (sparse_gemm.cu, mma.sp, and
// sparse_gemm_wgmma.cu, wgmma.sp): every CTA builds the same per-expert tile prefix from the
// device-side token counts, so the host never syncs, then walks tiles blockIdx.x, +gridDim.x, …
// Tile order: expert-major, then m-block, then n-block (the n-blocks of one m-block are consecutive,
// so CTAs running side by side share that m-block's weights in L2).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace moesq::ops::detail {

struct Tile {
  int e = -1, mb = 0, nb = 0, count = 0;  // e < 0: past the last tile; count: the expert's clamped tokens
};

// Called by ONE warp (all 32 lanes): s_count[e] = min(counts[e], capacity) and the exclusive prefix
// s_prefix[e] = Σ_{e' < e} m_blocks·⌈s_count[e'] / block_n⌉ for e ≤ E (s_prefix[E] = total tiles),
// 32 experts per shuffle scan. The caller synchronizes the CTA before reading them.
__device__ inline void build_tile_prefix(const int32_t* counts, int capacity, int E, int m_blocks, int block_n,
                                         int* s_prefix, int* s_count, int lane) {
  int running = 0;
  for (int base = 0; base < E; base += 32) {
    const int e = base + lane;
    int v = 0;
    if (e < E) {
      const int c = min(counts[e], capacity);
      s_count[e] = c;
      v = m_blocks * ((c + block_n - 1) / block_n);
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += n;
    }
    if (e < E) s_prefix[e + 1] = running + v;
    running += __shfl_sync(0xffffffffu, v, 31);
  }
  if (lane == 0) s_prefix[0] = 0;
}

// Tile `tile` of the schedule: expert = the largest e with s_prefix[e] ≤ tile (binary search).
__device__ __forceinline__ Tile tile_at(int tile, const int* s_prefix, const int* s_count, int E, int block_n) {
  Tile t;
  if (tile >= s_prefix[E]) return t;
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (s_prefix[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  t.e = lo;
  t.count = s_count[lo];
  const int n_blocks = (t.count + block_n - 1) / block_n;
  const int local = tile - s_prefix[lo];
  t.mb = local / n_blocks;
  t.nb = local % n_blocks;
  return t;
}

}  // namespace moesq::ops::detail
