// Decode path of gemm_bf16 (gemm_bf16_decode.h): M ≤ kGemmSmallM. A CTA of 8 or 4 warps owns 128
// output columns (16 or 32 per warp: 2 or 4 n8 MMA tiles) and every token (⌈M / 16⌉ m16 tiles, rows past M zero); K
// advances in 64-wide tiles through a CTA-wide cp.async ring of 4 stages (3 where four do not leave room
// for two CTAs per SM), each stage holding the CTA's 128 W rows and the tokens' hi (+ lo) rows. grid (N
// tiles, split slices, groups); with split_ws the slices of an N tile are one cluster: each CTA runs
// its slice's chains, parks them in its shared memory, and the cluster's CTAs then fold all slices
// (read through distributed shared memory) in ascending slice order, each CTA a share of the elements.
//
// Non-obvious decision: the MMA sequence of every output element is the tile kernel's exactly — 64-wide
// K tiles from the range start, zero-filled in 8-element vectors past the range, k16 steps in
// ascending order, hi then lo per step, accumulators from zero, one m16n8k16 MMA per k16 (a wmma
// m16n16k16's 8-column half), slices added in ascending order as gemm_bf16_split_reduce adds them — and
// an element of such an MMA depends only on its own row of A and column of B. So a row gets the same
// bits here as in the 64×64 tile kernel at any M; the staging (one activation tile for 128 columns)
// changes the bytes moved, never the reduction order.
#include "ops/gemm_bf16/gemm_bf16_decode.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "core/env_switch.h"
#include "ops/gemm_bf16/cp_async.cuh"
#include "ops/gemm_bf16/gemm_bf16_decode_tile.cuh"
#include "ops/gemm_bf16/gemm_bf16_small_m.h"
#include "ops/gemm_bf16/mma_bf16.cuh"

namespace moesq::ops::detail {

namespace {

constexpr int kBN = kDecodeBN, kBK = kDecodeBK, kLds = kDecodeLds, kVecRow = kDecodeVecRow;
constexpr size_t kSmemTwoCtas = kDecodeSmemTwoCtas;

// bf16 elements of one ring stage: kBN W rows, then mt·16 token rows of x, then of x_lo.
__host__ __device__ constexpr int stage_elems(int mt, bool lo) { return (kBN + mt * 16 * (lo ? 2 : 1)) * kLds; }
size_t ring_bytes(int mt, bool lo, int stages) {
  return static_cast<size_t>(stages) * stage_elems(mt, lo) * sizeof(uint16_t);
}
int token_tiles_of(int64_t M) { return M <= 16 ? 1 : M <= 32 ? 2 : 4; }
// 4 stages, or 3 where four leave no room for a second CTA per SM.
int stages_of(int mt, bool lo) { return ring_bytes(mt, lo, 4) <= kSmemTwoCtas ? 4 : 3; }
// The ring, or the fp32 partial tile [mt·16, kBN] of a split slice that reuses it, whichever is larger.
size_t smem_bytes(int mt, bool lo, int stages) {
  return std::max(ring_bytes(mt, lo, stages), static_cast<size_t>(mt) * 16 * kBN * sizeof(float));
}

// kMT: m16 token tiles staged (M ≤ 16·kMT); kWN: output columns per warp (16 or 32: 2 or 4 n8 MMA
// tiles); kWR: warp rows (1 or 2): the CTA's kBN / kWN column warps are repeated kWR times, warp row r
// taking token tiles [r·kMT/kWR, (r+1)·kMT/kWR) — fewer activation fragments per warp per W fragment,
// the same shared-memory ring. Warps: kWR · kBN / kWN. prefetch: bytes of W the first
// kGemmPrefetchCtas CTAs ask L2 for before the PDL wait (gemm_bf16_prefetch_bytes; −1, the small-M
// kernel's per-CTA rule, is taken as 0).
template <int kMT, int kStages, int kWN, int kWR>
__global__ void __launch_bounds__(32 * kWR * kBN / kWN, 2) gemm_bf16_decode_kernel(GemmBf16Args a, int64_t prefetch) {
  constexpr int kThreads = 32 * kWR * kBN / kWN, kNT = kWN / 8;  // threads; n8 tiles per warp
  constexpr int kMTW = kMT / kWR;                                 // token tiles per warp
  static_assert(kMTW * kWR == kMT, "warp rows split the token tiles evenly");
  constexpr int kWVec = kBN * kVecRow / kThreads;         // W vectors per thread per stage
  static_assert(kWVec * kThreads == kBN * kVecRow, "the W loader splits a stage evenly over the threads");
  if (prefetch > 0) prefetch_l2_grid(a.w, prefetch, kGemmPrefetchCtas);  // W: no kernel's output
  pdl_enter();
  extern __shared__ __align__(128) unsigned char s_raw[];
  uint16_t* ring = reinterpret_cast<uint16_t*>(s_raw);
  constexpr int kXRows = 16 * kMT;
  const bool lo = a.x_lo != nullptr;
  const int selems = stage_elems(kMT, lo), x_ops = lo ? 2 : 1;
  const DecodeCta cta = decode_cta(a);
  if (cta.rows <= 0) return;  // the same for every CTA of a cluster (one group)
  const int g = cta.g, tiles = cta.tiles;
  const int64_t rows = cta.rows, k_begin = cta.k_begin, k_end = cta.k_end, n0 = cta.n0;
  const bool split = cta.split;
  const uint16_t *x = cta.x, *xl = cta.xl, *w = cta.w;
  const int tid = threadIdx.x, lane = tid % 32;
  const int warp = tid / 32 % (kBN / kWN), mt0 = tid / 32 / (kBN / kWN) * kMTW;  // column warp; first token tile

  // Token rows past `rows` are zero in every stage, written once here (the loads never touch them).
  for (int v = tid; v < kStages * x_ops * kXRows * kVecRow; v += kThreads) {
    const int c = v % kVecRow, r = v / kVecRow % kXRows, o = v / (kVecRow * kXRows);  // o = stage · x_ops + operand
    if (r >= rows)
      *reinterpret_cast<uint4*>(ring + (o / x_ops) * selems + (kBN + (o % x_ops) * kXRows + r) * kLds + c * 8) =
          make_uint4(0, 0, 0, 0);
  }
  // Stage K tile t into slot t % kStages: W rows (zero past N and the range), then the tokens' rows.
  auto issue = [&](int t) {
    if (t < tiles) {
      uint16_t* st = ring + (t % kStages) * selems;
      const int64_t k0 = k_begin + static_cast<int64_t>(t) * kBK;
#pragma unroll
      for (int i = 0; i < kWVec; ++i) {
        const int v = tid + i * kThreads, r = v / kVecRow, c = (v % kVecRow) * 8;
        const bool ok = k0 + c < k_end && n0 + r < a.N;
        cp_async16(st + r * kLds + c, ok ? w + (n0 + r) * a.K + k0 + c : w, ok);
      }
      for (int v = tid; v < kXRows * kVecRow; v += kThreads) {
        const int r = v / kVecRow, c = (v % kVecRow) * 8;
        if (r >= rows) continue;
        const bool ok = k0 + c < k_end;
        cp_async16(st + (kBN + r) * kLds + c, ok ? x + r * a.K + k0 + c : x, ok);
        if (lo) cp_async16(st + (kBN + kXRows + r) * kLds + c, ok ? xl + r * a.K + k0 + c : xl, ok);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[kMTW][kNT][4];
#pragma unroll
  for (int i = 0; i < kMTW; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  const int live_tiles = min(kMTW, static_cast<int>((rows + 15) / 16) - mt0);  // this warp's tiles with a row < rows

  for (int t = 0; t < kStages - 1; ++t) issue(t);
  for (int t = 0; t < tiles; ++t) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
    __syncthreads();  // tile t visible to all; slot (t − 1) % kStages free for refilling
    issue(t + kStages - 1);
    const uint16_t* st = ring + (t % kStages) * selems;
    const uint16_t* sw = st + warp * kWN * kLds;
    const uint16_t* sx = st + kBN * kLds;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t b[kNT / 2][4];  // n8 tiles 2p, 2p + 1: b[p][0], b[p][1] (k halves 0 and 8), b[p][2], b[p][3]
#pragma unroll
      for (int p = 0; p < kNT / 2; ++p)
        ldmatrix_x4(b[p], sw + (p * 16 + (lane / 16) * 8 + lane % 8) * kLds + kk + ((lane / 8) % 2) * 8);
#pragma unroll
      for (int i = 0; i < kMTW; ++i) {
        if (i >= live_tiles) break;  // warp-uniform: no MMA for all-zero token tiles
        uint32_t af[4];
        ldmatrix_x4(af, sx + ((mt0 + i) * 16 + lane % 16) * kLds + kk + (lane / 16) * 8);
#pragma unroll
        for (int p = 0; p < kNT / 2; ++p) {
          mma_bf16(acc[i][2 * p], af, b[p][0], b[p][1]);
          mma_bf16(acc[i][2 * p + 1], af, b[p][2], b[p][3]);
        }
        if (lo) {  // the low parts after the high parts, per k16 step (the tile kernel's order)
          ldmatrix_x4(af, sx + (kXRows + (mt0 + i) * 16 + lane % 16) * kLds + kk + (lane / 16) * 8);
#pragma unroll
          for (int p = 0; p < kNT / 2; ++p) {
            mma_bf16(acc[i][2 * p], af, b[p][0], b[p][1]);
            mma_bf16(acc[i][2 * p + 1], af, b[p][2], b[p][3]);
          }
        }
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);

  // Accumulator q of tile (i, j): token row (mt0 + i)·16 + lane/4 (+8 for q ≥ 2), column warp·kWN + j·8 +
  // 2·(lane%4) + q%2.
  decode_epilogue<kMTW, kNT, kThreads>(a, g, rows, n0, split, mt0, warp * kWN, 16 * kMT, s_raw,
                                       [&](int i, int j, int q) { return acc[i][j][q]; });
}

template <int kMT, int kStages, int kWN, int kWR>
void launch_decode(const GemmBf16Args& a, cudaStream_t stream) {
  constexpr int kThreads = 32 * kWR * kBN / kWN;
  const bool lo = a.x_lo != nullptr;
  static const bool configured = [] {  // once per instance: not a stream operation, so capture-safe
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(gemm_bf16_decode_kernel<kMT, kStages, kWN, kWR>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_bytes(kMT, true, kStages))));
    return true;
  }();
  (void)configured;
  launch_decode_grid("gemm_bf16_decode_kernel", gemm_bf16_decode_kernel<kMT, kStages, kWN, kWR>, a, kThreads,
                     smem_bytes(kMT, lo, kStages), stream);
}

// kWR = 2 only where there are two token tiles to split (M > 16); one warp row below.
template <int kWN, int kWR>
void launch_decode_cols(const GemmBf16Args& a, cudaStream_t stream) {
  const int mt = token_tiles_of(a.M);
  const int st = stages_of(mt, a.x_lo != nullptr);
  if (mt == 1) return st == 4 ? launch_decode<1, 4, kWN, 1>(a, stream) : launch_decode<1, 3, kWN, 1>(a, stream);
  if (mt == 2) return st == 4 ? launch_decode<2, 4, kWN, kWR>(a, stream) : launch_decode<2, 3, kWN, kWR>(a, stream);
  return st == 4 ? launch_decode<4, 4, kWN, kWR>(a, stream) : launch_decode<4, 3, kWN, kWR>(a, stream);
}

}  // namespace

bool gemm_bf16_decode_fits(const GemmBf16Args& a) {
  return a.M >= 1 && a.M <= kGemmSmallM && !a.fused_topk && gemm_bf16_chain_slices(a) <= kGemmDecodeMaxSlices &&
         (!a.split_ws || a.groups == 1);
}

int64_t gemm_bf16_decode_min_m() {
  static const int64_t m = env_int("MOESQ_DECODE_GEMM_MIN_M", kGemmDecodeMinM, 1, kGemmSmallM + 1);
  return m;
}

bool gemm_bf16_decode_enabled(const GemmBf16Args& a) {
  if (a.M < gemm_bf16_decode_min_m() || !gemm_bf16_decode_fits(a)) return false;
  static const int64_t min_ctas = env_int("MOESQ_DECODE_GEMM_MIN_CTAS", kGemmDecodeMinCtas, 1, INT64_MAX);
  const int64_t ctas = (a.N + kBN - 1) / kBN * gemm_bf16_chain_slices(a) * a.groups;
  return ctas >= min_ctas;
}

void gemm_bf16_decode(const GemmBf16Args& a, cudaStream_t stream) {
  // The layout by M (gemm_bf16_decode.h), unless MOESQ_DECODE_GEMM_WARP_COLS / _ROWS fix it.
  static const int64_t env_cols = env_int("MOESQ_DECODE_GEMM_WARP_COLS", 0, 16, 32);
  static const int64_t env_rows = env_int("MOESQ_DECODE_GEMM_WARP_ROWS", 0, 1, 2);
  static const bool wgmma = env_switch("MOESQ_DECODE_GEMM_WGMMA", false);
  if (wgmma && a.M > 16) return gemm_bf16_decode_wg(a, stream);
  const int cols = env_cols == 16 || env_cols == 32 ? static_cast<int>(env_cols) : a.M > 16 ? 32 : 16;
  const int rows = cols == 16 ? 1 : env_rows == 1 || env_rows == 2 ? static_cast<int>(env_rows) : a.M > 16 ? 2 : 1;
  gemm_bf16_decode(a, stream, cols, rows);
}

void gemm_bf16_decode(const GemmBf16Args& a, cudaStream_t stream, int warp_cols, int warp_rows) {
  MOESQ_CHECK((warp_cols == 16 || warp_cols == 32) && (warp_rows == 1 || warp_rows == 2),
              "gemm_bf16_decode: warp_cols=", warp_cols, " (16 or 32), warp_rows=", warp_rows, " (1 or 2)");
  if (warp_cols == 32) return warp_rows == 2 ? launch_decode_cols<32, 2>(a, stream) : launch_decode_cols<32, 1>(a, stream);
  launch_decode_cols<16, 1>(a, stream);  // 8 column warps already; 16 warps would exceed __launch_bounds__' 2 CTAs/SM
}

}  // namespace moesq::ops::detail
