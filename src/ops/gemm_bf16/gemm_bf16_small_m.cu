// Small-M path of gemm_bf16 (gemm_bf16_small_m.h): M ≤ kGemmSmallM, 16-row tiles (grid y). Each warp
// owns one chain — 16 rows × 16 output columns over one K range (the whole K, or one kGemmSplitK
// slice) — and streams its W rows and x rows (zero-filled past the group's rows) through a private
// 4-stage cp.async ring, so a warp keeps 4 K tiles in flight instead of one. With split_ws the 4 warps of a CTA share
// one 16-column group and take its slices in turn; the CTA adds the slice sums in ascending order
// itself (no partials in global memory, no second kernel).
//
// Non-obvious decision: the MMA sequence of every chain is the tile kernel's exactly — 64-wide K
// tiles from the range start, zero-filled in 8-element vectors past the range, k16 steps in order,
// hi then lo per step, accumulators from zero — and an element of an m16n16k16 MMA depends only on its
// own row of A and column of B, so a row gets the same bits here as in the 64×64 tile kernel at any
// M (the batch invariance of gemm_bf16.h; tests/gpu/test_engine_ops.cu compares the two bitwise).
#include "ops/gemm_bf16/gemm_bf16_small_m.h"

#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "core/env_switch.h"
#include "ops/gemm_bf16/cp_async.cuh"
#include "ops/gemm_bf16/mma_bf16.cuh"
#include "ops/router_topk/router_topk_token.cuh"

namespace moesq::ops::detail {

namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kLds = kGemmBlockK + 8;            // bf16 row stride of a staged tile (16 B pad)
constexpr int kTileElems = 16 * kLds;            // one 16-row operand tile of one stage
constexpr int kFrag = 16 * 16;                   // fp32 elements of one accumulator tile
constexpr int kMaxSmem = 226 * 1024;  // the SM's 227 KB less 1 KB: the kernel's static s_last would not fit the attribute

}  // namespace

int64_t gemm_bf16_prefetch_bytes(const GemmBf16Args& a) {
  static const int64_t budget_mb = env_int("MOESQ_L2_PREFETCH_MB", 24, -1, 1 << 20);
  if (a.counts || a.K % 8 != 0 || reinterpret_cast<uintptr_t>(a.w) % 16 != 0 || budget_mb == 0) return 0;
  if (budget_mb < 0) return -1;
  return std::min<int64_t>(budget_mb << 20, a.groups * a.N * a.K * static_cast<int64_t>(sizeof(uint16_t)));
}

namespace {

template <int kStages>
__device__ __forceinline__ void cp_async_wait_stages() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1)); }

// K tiles in flight per warp: 4, or 3 with hi + lo activations (3 operands) and M > 16, so that two CTAs
// fit an SM (2 × 110.6 KB of rings did not): TPOT −2 % at batch 64, but +4 % at batch 1, where one CTA
// per SM with deeper rings wins (bench/NOTES.md, session 29); or MOESQ_SMALL_M_STAGES (3 | 4). Never
// changes a bit: only how far ahead the loads run (stages_of).
int stages_of(const GemmBf16Args& a) {
  static const int forced = static_cast<int>(env_int("MOESQ_SMALL_M_STAGES", 0, 3, 4));
  return forced ? forced : a.x_lo && a.M > 16 ? 3 : 4;
}

// 16-row operand tiles of one ring stage: W, then kTT token tiles of x, then kTT of x_lo.
inline int stage_tiles(const GemmBf16Args& a, int tt) { return 1 + tt * (a.x_lo ? 2 : 1); }

size_t smem_bytes(const GemmBf16Args& a, int tt, int stages) {
  const size_t ring = static_cast<size_t>(kWarps) * stages * stage_tiles(a, tt) * kTileElems * sizeof(uint16_t);
  const size_t parts = static_cast<size_t>(a.split_ws ? gemm_bf16_chain_slices(a) : kWarps) * tt * kFrag * sizeof(float);
  return ring + parts;
}
size_t smem_bytes(const GemmBf16Args& a) { return smem_bytes(a, 1, stages_of(a)); }

// grid (column groups, row blocks of 16·kTT tokens, groups). split: a CTA = one 16-column group, warp w takes
// slices w, w + 4, …; else a CTA = 4 column groups, one chain per warp over the whole K. kTT: the 16-token
// tiles a warp multiplies against each staged W tile (1: one token tile per CTA row; 2, 4: W read once for
// 32 or 64 tokens — MOESQ_SMALL_M_TOKEN_TILES, session 30); every accumulator's chain is the same.
// fuse_topk: then the routing of rt (GemmBf16Args::fused_topk) by the last CTA to finish.
// prefetch: bytes of W from its start that the first kGemmPrefetchCtas CTAs ask L2 for before the wait
// (0: none; -1: each CTA its own rows, session 28's rule).
template <int kStages, int kTT>
__global__ void __launch_bounds__(kThreads)
    gemm_bf16_small_m_kernel(GemmBf16Args a, RouterTopkArgs rt, bool fuse_topk, int64_t prefetch) {
  using namespace nvcuda;
  const bool split = a.split_ws != nullptr;
  // Before the wait (core/cuda/pdl.cuh): W is no kernel's output, so it starts streaming into L2 while
  // the previous kernel finishes (a decode step's projections read W once, at M ≤ 64). The first CTAs
  // — the resident wave — share the grid's first `prefetch` bytes in 16 KB pieces, so the CTAs of later
  // waves also find their rows in L2; a budget below L2's size, because past it the prefetched lines
  // are evicted before their reads (session 28's per-CTA rule read the 622 MB lm_head 1.47 times,
  // bench/NOTES.md session 29). Grouped calls with counts skip it (most groups of a decode step have
  // no rows), as do the other row tiles (the same rows).
  if (prefetch > 0) {
    prefetch_l2_grid(a.w, prefetch, kGemmPrefetchCtas);
  } else if (prefetch < 0 && blockIdx.y == 0) {
    const int64_t n_first = static_cast<int64_t>(blockIdx.x) * (split ? 16 : 16 * kWarps);
    const int64_t n_last = min(a.N, n_first + (split ? 16 : 16 * kWarps));
    if (n_first < n_last)
      prefetch_l2_range(a.w + (static_cast<int64_t>(blockIdx.z) * a.N + n_first) * a.K,
                        static_cast<size_t>(n_last - n_first) * a.K * sizeof(uint16_t));
  }
  pdl_enter();
  extern __shared__ __align__(128) unsigned char s_raw[];
  const int operands = 1 + kTT * (a.x_lo ? 2 : 1);  // tiles per stage (stage_tiles)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slices = gemm_bf16_chain_slices(a);
  uint16_t* ring = reinterpret_cast<uint16_t*>(s_raw) + warp * kStages * operands * kTileElems;
  float* s_part = reinterpret_cast<float*>(s_raw + static_cast<size_t>(kWarps) * kStages * operands * kTileElems *
                                                      sizeof(uint16_t));
  const int g = blockIdx.z;
  const int64_t rows = a.counts ? min(max(a.counts[g], 0), static_cast<int>(a.M)) : a.M;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * 16 * kTT;
  if (m0 >= rows) return;  // never with fuse_topk (no counts: rows = M), whose ticket needs every CTA
  const int64_t n0 = split ? static_cast<int64_t>(blockIdx.x) * 16 : (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * 16;
  const uint16_t* x = a.x + (static_cast<int64_t>(g) * a.M + m0) * a.K;
  const uint16_t* xl = a.x_lo ? a.x_lo + (static_cast<int64_t>(g) * a.M + m0) * a.K : nullptr;
  const uint16_t* w = a.w + static_cast<int64_t>(g) * a.N * a.K;
  for (int sl = split ? warp : 0; sl < slices && n0 < a.N; sl += split ? kWarps : slices) {
    const int64_t k_begin = split ? static_cast<int64_t>(sl) * kGemmSplitK : 0;
    const int64_t k_end = split ? min(a.K, k_begin + kGemmSplitK) : a.K;
    const int tiles = static_cast<int>((k_end - k_begin + kGemmBlockK - 1) / kGemmBlockK);
    // Stage tile t of this chain into ring slot t % kStages: 16 rows × 8 vectors per operand, 4 per lane.
    auto issue = [&](int t) {
      if (t < tiles) {
        uint16_t* st = ring + (t % kStages) * operands * kTileElems;
        const int64_t k0 = k_begin + static_cast<int64_t>(t) * kGemmBlockK;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int v = lane + 32 * i, r = v / 8, c = (v % 8) * 8;
          const bool kin = k0 + c < k_end;
          const bool wv = kin && n0 + r < a.N;
          cp_async16(st + r * kLds + c, wv ? w + (n0 + r) * a.K + k0 + c : w, wv);
#pragma unroll
          for (int tt = 0; tt < kTT; ++tt) {
            const int64_t xr = 16 * tt + r;  // row within the CTA's token block
            const bool xv = kin && m0 + xr < rows;
            cp_async16(st + (1 + tt) * kTileElems + r * kLds + c, xv ? x + xr * a.K + k0 + c : x, xv);
            if (xl) cp_async16(st + (1 + kTT + tt) * kTileElems + r * kLds + c, xv ? xl + xr * a.K + k0 + c : xl, xv);
          }
        }
      }
      cp_async_commit();  // an empty group past the end keeps the wait count uniform
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kTT];
#pragma unroll
    for (int tt = 0; tt < kTT; ++tt) wmma::fill_fragment(acc[tt], 0.0f);
    for (int t = 0; t < kStages - 1; ++t) issue(t);
    for (int t = 0; t < tiles; ++t) {
      issue(t + kStages - 1);
      cp_async_wait_stages<kStages>();
      __syncwarp();
      const uint16_t* st = ring + (t % kStages) * operands * kTileElems;
#pragma unroll
      for (int kk = 0; kk < kGemmBlockK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, reinterpret_cast<const __nv_bfloat16*>(st + kk), kLds);
#pragma unroll
        for (int tt = 0; tt < kTT; ++tt) {  // each token tile's chain: hi then lo per k16 step, as ever
          wmma::load_matrix_sync(fa, reinterpret_cast<const __nv_bfloat16*>(st + (1 + tt) * kTileElems + kk), kLds);
          wmma::mma_sync(acc[tt], fa, fb, acc[tt]);
          if (xl) {
            wmma::load_matrix_sync(fa, reinterpret_cast<const __nv_bfloat16*>(st + (1 + kTT + tt) * kTileElems + kk), kLds);
            wmma::mma_sync(acc[tt], fa, fb, acc[tt]);
          }
        }
      }
      __syncwarp();  // the slot is refilled by the next iteration's issue
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
#pragma unroll
    for (int tt = 0; tt < kTT; ++tt)
      wmma::store_matrix_sync(s_part + ((split ? sl : warp) * kTT + tt) * kFrag, acc[tt], 16, wmma::mem_row_major);
  }
  __syncthreads();
  const int groups_in_cta = split ? 1 : kWarps;
  for (int v = threadIdx.x; v < groups_in_cta * kTT * kFrag; v += kThreads) {
    const int cg = v / (kTT * kFrag), tt = v / kFrag % kTT, e = v % kFrag, r = 16 * tt + e / 16, c = e % 16;
    const int64_t n = (split ? static_cast<int64_t>(blockIdx.x) * 16 : (static_cast<int64_t>(blockIdx.x) * kWarps + cg) * 16) + c;
    if (m0 + r >= rows || n >= a.N) continue;
    const int64_t o = (static_cast<int64_t>(g) * a.M + m0 + r) * a.ldy + n;
    float val = s_part[((split ? 0 : cg) * kTT + tt) * kFrag + e];
    if (split)
      for (int s = 1; s < slices; ++s) val = __fadd_rn(val, s_part[(s * kTT + tt) * kFrag + e]);  // slice order, as split_reduce
    store_y(a, o, val);
  }
  if (!fuse_topk) return;
  // The routing: the last CTA to take a ticket sees every CTA's logits (each thread's writes fenced
  // before the CTA's ticket; the last CTA fences after it and reads past L1), zeroes the dispatch
  // counts and routes the T tokens a warp each with router_topk's code, then leaves the ticket 0.
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int total = static_cast<int>(gridDim.x * gridDim.y * gridDim.z);
    s_last = atomicAdd(a.topk_ticket, 1) == total - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (threadIdx.x == 0) *a.topk_ticket = 0;
  if (rt.counts)
    for (int e = threadIdx.x; e < rt.num_experts; e += kThreads) rt.counts[e] = 0;
  float* s_p = reinterpret_cast<float*>(s_raw);  // the K-tile rings are free now
  float* s_c = s_p + kWarps * kRouterTopkMaxExperts;
  for (int64_t t = warp; t < rt.T; t += kWarps)
    router_topk_token(rt, t, s_p + warp * kRouterTopkMaxExperts, s_c + warp * kRouterTopkMaxExperts, lane);
}

}  // namespace

bool gemm_bf16_small_m_fits(const GemmBf16Args& a) { return a.M <= kGemmSmallM && smem_bytes(a) <= kMaxSmem; }

int gemm_bf16_small_m_token_tiles() {  // 1–4; the launcher takes 3 as 2
  static const int tt = static_cast<int>(env_int("MOESQ_SMALL_M_TOKEN_TILES", 1, 1, 4));
  return tt;
}

namespace {

template <int kStages, int kTT>
void launch_small_m(const GemmBf16Args& a, cudaStream_t stream, size_t smem) {
  static const bool configured = [] {  // once per instance: not a stream operation, so capture-safe
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(gemm_bf16_small_m_kernel<kStages, kTT>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    return true;
  }();
  (void)configured;
  const int64_t col_groups = (a.N + 15) / 16;
  const int64_t ctas = a.split_ws ? col_groups : (col_groups + kWarps - 1) / kWarps;
  MOESQ_CHECK(ctas <= 0x7fffffff && a.groups <= 65535, "gemm_bf16: N=", a.N, " or G=", a.groups, " too large");
  const dim3 grid(static_cast<unsigned>(ctas), static_cast<unsigned>((a.M + 16 * kTT - 1) / (16 * kTT)),
                  static_cast<unsigned>(a.groups));
  const bool fuse = a.fused_topk != nullptr;  // gemm_bf16 checked gemm_bf16_fuses_topk
  static_assert(2 * kWarps * kRouterTopkMaxExperts * sizeof(float) <= kWarps * 3 * 2 * kTileElems * sizeof(uint16_t),
                "the fused routing's scratch reuses the K-tile rings");
  const RouterTopkArgs rt = fuse ? *a.fused_topk : RouterTopkArgs{};
  launch_pdl("gemm_bf16_small_m_kernel", gemm_bf16_small_m_kernel<kStages, kTT>, grid, dim3(kThreads), smem, stream, a,
             rt, fuse, gemm_bf16_prefetch_bytes(a));
}

// kTT > 1: the deepest ring (4, 3, then 2 stages) whose shared memory fits; 0 when none does.
int stages_for(const GemmBf16Args& a, int tt) {
  for (int st = 4; st >= 2; --st)
    if (smem_bytes(a, tt, st) <= kMaxSmem) return st;
  return 0;
}

}  // namespace

void gemm_bf16_small_m(const GemmBf16Args& a, cudaStream_t stream) {
  gemm_bf16_small_m(a, stream, gemm_bf16_small_m_token_tiles());
}

void gemm_bf16_small_m(const GemmBf16Args& a, cudaStream_t stream, int token_tiles) {
  // More than one token tile only where there are more tokens than one tile (and never for the fused
  // routing, whose scratch layout assumes one), within the shared memory.
  int tt = token_tiles >= 4 ? 4 : token_tiles >= 2 ? 2 : 1;
  while (tt > 1 && 16 * (tt / 2) >= a.M) tt /= 2;  // 2 tiles for M ≤ 32, 1 for M ≤ 16
  const int st = tt > 1 && !a.fused_topk ? stages_for(a, tt) : 0;
  if (st == 0) {
    const size_t smem = smem_bytes(a);
    if (stages_of(a) == 3) return launch_small_m<3, 1>(a, stream, smem);
    return launch_small_m<4, 1>(a, stream, smem);
  }
  const size_t smem = smem_bytes(a, tt, st);
  if (tt == 2) {
    if (st == 4) return launch_small_m<4, 2>(a, stream, smem);
    if (st == 3) return launch_small_m<3, 2>(a, stream, smem);
    return launch_small_m<2, 2>(a, stream, smem);
  }
  if (st == 4) return launch_small_m<4, 4>(a, stream, smem);
  if (st == 3) return launch_small_m<3, 4>(a, stream, smem);
  return launch_small_m<2, 4>(a, stream, smem);
}

}  // namespace moesq::ops::detail
