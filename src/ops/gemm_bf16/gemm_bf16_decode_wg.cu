// Decode path of gemm_bf16, wgmma form (gemm_bf16_decode.h, gemm_bf16_decode_wg): one warpgroup per CTA
// owns 128 output columns and 64 token rows (warp w rows 16w … 16w + 15, rows past M zero); K advances in
// 64-wide tiles through a cp.async ring (4 stages, 3 with lo parts so that two CTAs fit an SM), each stage
// holding the CTA's 128 W rows K-major with the 128-byte swizzle (wgmma's B from shared memory) and the
// tokens' hi (+ lo) rows padded for ldmatrix (wgmma's A from registers: each warp's m16 fragment, the
// mma.m16n8k16 A layout). Per k16 step one wgmma m64n128k16 for hi, then one for lo, into one fp32
// accumulator; split slices are CTAs of one cluster folded as the mma.sync kernel folds them
// (gemm_bf16_decode_tile.cuh).
//
// Non-obvious decision: the chain per output element is the tile kernel's (64-wide K tiles from the range
// start, zero-filled past it, k16 steps ascending, hi then lo, accumulators from zero), and on sm_90a a
// wgmma k16 step adds to its fp32 accumulator with the bits of mma.sync m16n8k16 — bench/probe_wgmma_order
// measured 0 of 409,600 elements differ (bench/NOTES.md session 33). So a row gets the 64×64 tile kernel's
// bits here too; what changes is the rate: one wgmma issues the work of 64 mma.sync m16n8k16 at the
// warpgroup rate (the mma.sync kernel at M = 64 spends ≈ 2.7 GFLOP of hi + lo MMAs per q|k|v call at
// mma.sync's rate, latency bound: bench/NOTES.md session 32).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/gemm_bf16/cp_async.cuh"
#include "ops/gemm_bf16/gemm_bf16_decode.h"
#include "ops/gemm_bf16/gemm_bf16_decode_tile.cuh"
#include "ops/gemm_bf16/mma_bf16.cuh"
#include "ops/sparse_gemm/wgmma.cuh"

namespace moesq::ops::detail {

namespace {

constexpr int kThreads = 128;                                   // one warpgroup
constexpr int kTokRows = 64;                                    // wgmma's M: all the tokens
constexpr int kWElems = kDecodeBN * kDecodeBK;                  // a stage's W: 128 rows of 128 B (16 KB)
constexpr int kXElems = kTokRows * kDecodeLds;                  // a stage's x (or x_lo) rows
static_assert(kDecodeBK * 2 == 128, "a W row of a K tile is one 128-byte swizzle row");
static_assert(kWElems * 2 % 1024 == 0, "every stage's W starts on a 1024-byte swizzle atom");

constexpr size_t stage_bytes(bool lo) { return (kWElems + (lo ? 2 : 1) * kXElems) * sizeof(uint16_t); }
// The ring (or the fp32 partial tile [64, 128] of a split slice that reuses it) plus 1 KB to align it.
constexpr size_t smem_bytes(bool lo, int stages) {
  return 1024 + std::max(static_cast<size_t>(stages) * stage_bytes(lo),
                         static_cast<size_t>(kTokRows) * kDecodeBN * sizeof(float));
}
// Stages: 3 with lo parts, 4 without — the most that leave room for a second CTA per SM.
constexpr int kStagesLo = 3, kStagesHi = 4;
static_assert(smem_bytes(true, kStagesLo) <= kDecodeSmemTwoCtas && smem_bytes(true, kStagesLo + 1) > kDecodeSmemTwoCtas);
static_assert(smem_bytes(false, kStagesHi) <= kDecodeSmemTwoCtas && smem_bytes(false, kStagesHi + 1) > kDecodeSmemTwoCtas);

// kLo: the inputs have lo parts (a template argument: a branch between two wgmmas makes ptxas serialize them).
template <int kStages, bool kLo>
__global__ void __launch_bounds__(kThreads, 2) gemm_bf16_decode_wg_kernel(GemmBf16Args a, int64_t prefetch) {
  constexpr int kWVec = kDecodeBN * kDecodeVecRow / kThreads;  // W vectors per thread per stage (8)
  if (prefetch > 0) prefetch_l2_grid(a.w, prefetch, kGemmPrefetchCtas);  // W: no kernel's output
  pdl_enter();
  extern __shared__ unsigned char s_raw[];
  unsigned char* sm = s_raw + ((1024u - (smem_addr(s_raw) & 1023u)) & 1023u);  // the swizzle needs 1024-B atoms
  uint16_t* ws = reinterpret_cast<uint16_t*>(sm);                                 // [kStages][128][64] swizzled
  uint16_t* xs = ws + kStages * kWElems;                                          // [kStages][x_ops][64][kLds]
  constexpr bool lo = kLo;
  constexpr int x_ops = kLo ? 2 : 1;
  const DecodeCta cta = decode_cta(a);
  if (cta.rows <= 0) return;  // the same for every CTA of a cluster (one group)
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  // Token rows past `rows` are zero in every stage, written once here (the loads never touch them).
  for (int v = tid; v < kStages * x_ops * kTokRows * kDecodeVecRow; v += kThreads) {
    const int c = v % kDecodeVecRow, r = v / kDecodeVecRow % kTokRows, o = v / (kDecodeVecRow * kTokRows);
    if (r >= cta.rows) *reinterpret_cast<uint4*>(xs + o * kXElems + r * kDecodeLds + c * 8) = make_uint4(0, 0, 0, 0);
  }
  // Stage K tile t into slot t % kStages: W row r's 16-byte chunk c at chunk c ^ (r % 8) of its 128-byte
  // row (zero past N and the range), then the tokens' rows.
  auto issue = [&](int t) {
    if (t < cta.tiles) {
      uint16_t* wst = ws + (t % kStages) * kWElems;
      uint16_t* xst = xs + (t % kStages) * x_ops * kXElems;
      const int64_t k0 = cta.k_begin + static_cast<int64_t>(t) * kDecodeBK;
#pragma unroll
      for (int i = 0; i < kWVec; ++i) {
        const int v = tid + i * kThreads, r = v / kDecodeVecRow, c = v % kDecodeVecRow;
        const bool ok = k0 + c * 8 < cta.k_end && cta.n0 + r < a.N;
        cp_async16(wst + r * kDecodeBK + ((c ^ (r & 7)) * 8), ok ? cta.w + (cta.n0 + r) * a.K + k0 + c * 8 : cta.w, ok);
      }
      for (int v = tid; v < kTokRows * kDecodeVecRow; v += kThreads) {
        const int r = v / kDecodeVecRow, c = (v % kDecodeVecRow) * 8;
        if (r >= cta.rows) continue;
        const bool ok = k0 + c < cta.k_end;
        cp_async16(xst + r * kDecodeLds + c, ok ? cta.x + r * a.K + k0 + c : cta.x, ok);
        if (lo) cp_async16(xst + kXElems + r * kDecodeLds + c, ok ? cta.xl + r * a.K + k0 + c : cta.xl, ok);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait count uniform
  };

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;

  for (int t = 0; t < kStages - 1; ++t) issue(t);
  for (int t = 0; t < cta.tiles; ++t) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
    // This thread's cp.async writes (generic proxy) made visible to wgmma's reads (async proxy), then
    // every thread's: tile t complete; slot (t − 1) % kStages free (its wgmmas retired below).
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    issue(t + kStages - 1);
    const uint16_t* xst = xs + (t % kStages) * x_ops * kXElems + (warp * 16 + lane % 16) * kDecodeLds + (lane / 16) * 8;
    uint32_t ah[kDecodeBK / 16][4], al[kDecodeBK / 16][4];
#pragma unroll
    for (int s = 0; s < kDecodeBK / 16; ++s) {
      ldmatrix_x4(ah[s], xst + s * 16);
      if constexpr (kLo) ldmatrix_x4(al[s], xst + kXElems + s * 16);
    }
    const uint64_t desc = desc_k_major_sw128(smem_addr(ws + (t % kStages) * kWElems));
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < kDecodeBK / 16; ++s) {  // + 32 B per k16 step inside the 128-byte row
      WgmmaDense<kDecodeBN>::mma(acc, ah[s], desc + 2 * s, 1);
      if constexpr (kLo) WgmmaDense<kDecodeBN>::mma(acc, al[s], desc + 2 * s, 1);  // lo after hi, per k16 step
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc(acc);
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  // The split epilogue writes its partial tile with generic stores over the ring the last wgmmas read
  // through the async proxy (retired by wait<0> above): order the two proxies, as the loop does.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  // Accumulator 4j + q of warp w: the m16n8 C fragment of token tile w, n8 tile j (wgmma.h's layout).
  decode_epilogue<1, kDecodeBN / 8, kThreads>(a, cta.g, cta.rows, cta.n0, cta.split, warp, 0, kTokRows, sm,
                                              [&](int, int j, int q) { return acc[4 * j + q]; });
}

template <int kStages, bool kLo>
void launch_decode_wg(const GemmBf16Args& a, cudaStream_t stream) {
  static const bool configured = [] {  // once per instance: not a stream operation, so capture-safe
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(gemm_bf16_decode_wg_kernel<kStages, kLo>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_bytes(kLo, kStages))));
    return true;
  }();
  (void)configured;
  launch_decode_grid("gemm_bf16_decode_wg_kernel", gemm_bf16_decode_wg_kernel<kStages, kLo>, a, kThreads,
                     smem_bytes(kLo, kStages), stream);
}

}  // namespace

void gemm_bf16_decode_wg(const GemmBf16Args& a, cudaStream_t stream) {
  MOESQ_CHECK(a.M >= 1 && a.M <= kTokRows, "gemm_bf16_decode_wg: M=", a.M, " outside [1, ", kTokRows, "]");
  if (a.x_lo) return launch_decode_wg<kStagesLo, true>(a, stream);
  launch_decode_wg<kStagesHi, false>(a, stream);
}

}  // namespace moesq::ops::detail
