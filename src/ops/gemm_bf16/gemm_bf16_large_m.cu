// Large-M path of gemm_bf16 (gemm_bf16_large_m.h): a CTA of 8 warps owns a 128×128 output tile of one
// group, K advances in 64-wide tiles through a 3-stage cp.async ring (zero-filled past M, N, K and the
// group's count), each warp holds a 64×32 sub-tile as 4×4 mma.sync m16n8k16 fp32 accumulators whose
// operands come from ldmatrix (rows padded by 16 B: conflict-free).
//
// Non-obvious decision: the MMA sequence of every output element is the tile kernel's exactly — 64-wide
// K tiles from 0, zero-filled in 8-element vectors past K, k16 steps in ascending order, hi then lo per
// step, accumulators from zero, one m16n8k16 tensor-core MMA per k16 (what a wmma m16n16k16 is per
// 8-column half) — and an element of such an MMA depends only on its own row of A and column of B. So a
// row gets the same bits here as in the 64×64 tile kernel and the small-M path at any M: the bigger tile
// and the deeper pipeline change the speed, never the reduction order (gemm_bf16.h; tests/gpu/
// test_engine_ops.cu compares the paths bitwise). With split-K the slices are folded in registers in
// slice order (the order gemm_bf16_split_reduce adds them): no partials through global memory.
#include "ops/gemm_bf16/gemm_bf16_large_m.h"

#include <cuda_bf16.h>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/gemm_bf16/cp_async.cuh"
#include "ops/gemm_bf16/gemm_bf16_small_m.h"
#include "ops/gemm_bf16/mma_bf16.cuh"

namespace moesq::ops::detail {

namespace {

constexpr int kBM = kGemmLargeTile, kBN = kGemmLargeTile, kBK = kGemmBlockK;
constexpr int kThreads = 256;                        // 8 warps: 2 (M) × 4 (N)
constexpr int kStages = 3;                           // K tiles in flight
constexpr int kLds = kBK + 8;                        // bf16 row stride of a staged tile (144 B)
constexpr int kTile = kBM * kLds;                    // elements of one staged operand tile
constexpr int kVec = kBM * kBK / 8 / kThreads;       // 16-byte vectors per thread per operand tile
constexpr int kWarpM = 64, kWarpN = 32;
constexpr int kMI = kWarpM / 16, kNI = kWarpN / 8;   // m16 × n8 MMA tiles per warp
static_assert(kBM == kBN && kVec * kThreads * 8 == kBM * kBK, "the loader assumes square tiles split evenly");
static_assert(kBK % 16 == 0 && kNI % 2 == 0, "k16 steps; B fragments load two n8 tiles at a time");

size_t smem_bytes(bool lo) { return static_cast<size_t>(kStages) * (lo ? 3 : 2) * kTile * sizeof(uint16_t); }


// A fragments of the warp's kMI m16 tiles at k offset kk of a staged [kBM, kLds] tile.
__device__ __forceinline__ void load_a(uint32_t (&af)[kMI][4], const uint16_t* s, int wm, int lane, int kk) {
#pragma unroll
  for (int i = 0; i < kMI; ++i) ldmatrix_x4(af[i], s + (wm * kWarpM + i * 16 + lane % 16) * kLds + kk + (lane / 16) * 8);
}

// grid (N tiles, M tiles, groups). kSplit (split_ws given): the fixed K slices of gemm_bf16.h, each
// chain from zero, folded into `sum` in ascending slice order as gemm_bf16_split_reduce adds them;
// split_ws itself is not touched.
template <bool kSplit>
__global__ void __launch_bounds__(kThreads) gemm_bf16_large_m_kernel(GemmBf16Args a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  extern __shared__ __align__(128) unsigned char s_raw[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(s_raw);
  const int operands = a.x_lo ? 3 : 2;
  const int g = blockIdx.z;
  const int64_t rows = a.counts ? min(max(a.counts[g], 0), static_cast<int>(a.M)) : a.M;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  if (m0 >= rows) return;
  const uint16_t* x = a.x + static_cast<int64_t>(g) * a.M * a.K;
  const uint16_t* xl = a.x_lo ? a.x_lo + static_cast<int64_t>(g) * a.M * a.K : nullptr;
  const uint16_t* w = a.w + static_cast<int64_t>(g) * a.N * a.K;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wm = warp / 4, wn = warp % 4;
  const int tiles = static_cast<int>((a.K + kBK - 1) / kBK);

  // Stage K tile t into ring slot t % kStages (x, then W, then x_lo).
  auto issue = [&](int t) {
    if (t < tiles) {
      uint16_t* st = smem + (t % kStages) * operands * kTile;
      const int64_t k0 = static_cast<int64_t>(t) * kBK;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const int v = tid + i * kThreads, r = v / (kBK / 8), c = (v % (kBK / 8)) * 8;
        const bool kin = k0 + c < a.K;
        const bool xv = kin && m0 + r < rows, wv = kin && n0 + r < a.N;
        cp_async16(st + r * kLds + c, xv ? x + (m0 + r) * a.K + k0 + c : x, xv);
        cp_async16(st + kTile + r * kLds + c, wv ? w + (n0 + r) * a.K + k0 + c : w, wv);
        if (xl) cp_async16(st + 2 * kTile + r * kLds + c, xv ? xl + (m0 + r) * a.K + k0 + c : xl, xv);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kMI][kNI][4], sum[kSplit ? kMI : 1][kSplit ? kNI : 1][4];
#pragma unroll
  for (int i = 0; i < kMI; ++i)
#pragma unroll
    for (int j = 0; j < kNI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  constexpr int kSliceTiles = static_cast<int>(kGemmSplitK / kBK);
  static_assert(kGemmSplitK % kBK == 0, "split slices hold whole K tiles");

  for (int t = 0; t < kStages - 1; ++t) issue(t);
  for (int t = 0; t < tiles; ++t) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
    __syncthreads();          // tile t visible to all; slot (t - 1) % kStages free for refilling
    issue(t + kStages - 1);
    const uint16_t* sa = smem + (t % kStages) * operands * kTile;
    const uint16_t* sb = sa + kTile;
    const uint16_t* sl = sa + 2 * kTile;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[kMI][4], bf[kNI][2];
      load_a(af, sa, wm, lane, kk);
#pragma unroll
      for (int jj = 0; jj < kNI / 2; ++jj) {  // n8 tiles 2jj, 2jj + 1: k halves 0 and 8 of each
        uint32_t r[4];
        ldmatrix_x4(r, sb + (wn * kWarpN + jj * 16 + (lane / 16) * 8 + lane % 8) * kLds + kk + ((lane / 8) % 2) * 8);
        bf[2 * jj][0] = r[0], bf[2 * jj][1] = r[1], bf[2 * jj + 1][0] = r[2], bf[2 * jj + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < kMI; ++i)
#pragma unroll
        for (int j = 0; j < kNI; ++j) mma_bf16(acc[i][j], af[i], bf[j][0], bf[j][1]);
      if (xl) {  // the low parts after the high parts, per k16 step (the tile kernel's order)
        load_a(af, sl, wm, lane, kk);
#pragma unroll
        for (int i = 0; i < kMI; ++i)
#pragma unroll
          for (int j = 0; j < kNI; ++j) mma_bf16(acc[i][j], af[i], bf[j][0], bf[j][1]);
      }
    }
    if constexpr (kSplit) {
      if ((t + 1) % kSliceTiles == 0 || t + 1 == tiles) {  // slice done: sum (+)= its chain, restart from zero
        const bool first = t < kSliceTiles;
#pragma unroll
        for (int i = 0; i < kMI; ++i)
#pragma unroll
          for (int j = 0; j < kNI; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              sum[i][j][q] = first ? acc[i][j][q] : __fadd_rn(sum[i][j][q], acc[i][j][q]);
              acc[i][j][q] = 0.0f;
            }
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);

  // Accumulator q of tile (i, j): row lane/4 (+8 for q ≥ 2), column 2·(lane%4) + q%2.
#pragma unroll
  for (int i = 0; i < kMI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = m0 + wm * kWarpM + i * 16 + lane / 4 + h * 8;
      if (r >= rows) continue;
#pragma unroll
      for (int j = 0; j < kNI; ++j)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int64_t n = n0 + wn * kWarpN + j * 8 + 2 * (lane % 4) + q;
          if (n >= a.N) continue;
          const int64_t o = (static_cast<int64_t>(g) * a.M + r) * a.ldy + n;
          float val;
          if constexpr (kSplit) val = sum[i][j][2 * h + q];
          else val = acc[i][j][2 * h + q];
          store_y(a, o, val);
        }
    }
}

}  // namespace

bool gemm_bf16_large_m_fits(const GemmBf16Args& a) {
  if (a.M <= kGemmSmallM || a.N < kGemmLargeMinN) return false;
  if (a.M >= kGemmLargeMinM) return true;
  const int64_t tiles = (a.M + kBM - 1) / kBM * ((a.N + kBN - 1) / kBN) * a.groups;
  return !a.counts && tiles >= kGemmLargeMinTiles;
}

void gemm_bf16_large_m(const GemmBf16Args& a, cudaStream_t stream) {
  static const bool configured = [] {  // once: not a stream operation, so capture-safe
    for (const void* f : {reinterpret_cast<const void*>(gemm_bf16_large_m_kernel<false>),
                          reinterpret_cast<const void*>(gemm_bf16_large_m_kernel<true>)})
      MOESQ_CUDA_CHECK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(smem_bytes(true))));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>((a.N + kBN - 1) / kBN), static_cast<unsigned>((a.M + kBM - 1) / kBM),
                  static_cast<unsigned>(a.groups));
  MOESQ_CHECK(grid.y <= 65535 && grid.z <= 65535, "gemm_bf16: M=", a.M, " or G=", a.groups, " too large for the grid");
  if (a.split_ws)
    launch_pdl("gemm_bf16_large_m_kernel", gemm_bf16_large_m_kernel<true>, dim3(grid), dim3(kThreads),
               smem_bytes(a.x_lo != nullptr), stream, a);
  else
    launch_pdl("gemm_bf16_large_m_kernel", gemm_bf16_large_m_kernel<false>, dim3(grid), dim3(kThreads),
               smem_bytes(a.x_lo != nullptr), stream, a);
}

}  // namespace moesq::ops::detail
