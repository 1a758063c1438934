// The W-as-A decode path of gemm_bf16 (gemm_bf16_wa.h). A warp owns one chain — 16 weight rows × the
// ≤ 8 tokens over one K range (the whole K, or one kGemmSplitK slice) — and keeps kDepth 64-wide K tiles
// of its W rows in registers (16 words each, the m16n8k16 A fragments of the tile's four k16 steps),
// loading tile i + kDepth − 1 while it multiplies tile i. W never passes through shared memory; the
// tokens' rows (hi, lo) are copied there once per CTA, row stride K + 8 so the eight tokens' B words
// fall in distinct banks. A CTA has up to 8 warps (CtaShape): without split, 8 row tiles, one chain per
// warp over the whole K; with S slices, 8 / S row tiles of S warps (one slice each; S > 8: 8 warps
// taking the slices in turn), added in ascending slice order in shared memory. (Session 29's first
// version had 4 warps per CTA taking a row tile's slices in turn: the q|k|v and o_proj GEMMs had one
// chain per warp at most and o_proj two in sequence; it measured slower than the small-M kernel.)
//
// Non-obvious decision: the first kDepth − 1 tiles of each warp's first chain are loaded BEFORE the PDL
// wait (W is no kernel's output), with volatile loads the compiler cannot sink below it, so the weight
// stream of a decode projection starts while the previous kernel finishes.
#include "ops/gemm_bf16/gemm_bf16_wa.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "core/env_switch.h"
#include "ops/gemm_bf16/gemm_bf16_small_m.h"
#include "ops/gemm_bf16/mma_bf16.cuh"

namespace moesq::ops::detail {

namespace {

constexpr int kMaxWarps = 8, kMaxThreads = 32 * kMaxWarps;
constexpr int kTileWords = 16;             // A words per lane per tile: 4 k16 steps × 4
constexpr int kRowPad = 8;                 // bf16 padding of a staged token row
constexpr int kMaxSmem = 200 * 1024;
static_assert(kGemmBlockK == 64, "a tile is four k16 steps");

// A CTA: `tiles` row tiles of 16 × `per_tile` warps; warp w takes tile w / per_tile and the slices
// w % per_tile, + per_tile, … — so every (row tile, K slice) chain has a warp of its own up to 8 slices.
struct CtaShape {
  int tiles, per_tile;
};
__host__ __device__ inline CtaShape cta_shape(int slices) {
  const int per_tile = slices < kMaxWarps ? slices : kMaxWarps;
  return {kMaxWarps / per_tile, per_tile};
}

size_t smem_bytes(const GemmBf16Args& a) {
  const size_t rows = static_cast<size_t>(a.M) * static_cast<size_t>(a.K + kRowPad) * sizeof(uint16_t);
  const int slices = gemm_bf16_chain_slices(a);
  const size_t parts = slices > 1 ? static_cast<size_t>(cta_shape(slices).tiles) * slices * 16 * 8 * sizeof(float) : 0;
  return (a.x_lo ? 2 : 1) * rows + parts;
}

__device__ __forceinline__ uint32_t ld_w(const uint16_t* p, bool valid) {
  uint32_t r = 0;
  if (valid) asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(r) : "l"(p));
  return r;
}

// One warp's chain: rows r0 = n0 + g and r1 = n0 + g + 8 of W over [kb, ke).
struct Chain {
  const uint16_t* w0;
  const uint16_t* w1;
  bool v0, v1;
  int64_t kb, ke;
  int tiles;
};

// The A words of tile i: step s, words {row g, k 2t}, {row g+8, k 2t}, {row g, k 8+2t}, {row g+8, k 8+2t}
// (mma.m16n8k16 .bf16 A layout), zero past ke (whole 8-element vectors: ke % 8 == 0) or past N.
__device__ __forceinline__ void load_tile(uint32_t (&w)[kTileWords], const Chain& c, int i, int t) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int64_t k = c.kb + static_cast<int64_t>(i) * kGemmBlockK + 16 * s + 2 * t;
    const bool in0 = k < c.ke, in1 = k + 8 < c.ke;
    w[4 * s + 0] = ld_w(c.w0 + k, c.v0 && in0);
    w[4 * s + 1] = ld_w(c.w1 + k, c.v1 && in0);
    w[4 * s + 2] = ld_w(c.w0 + k + 8, c.v0 && in1);
    w[4 * s + 3] = ld_w(c.w1 + k + 8, c.v1 && in1);
  }
}

// d += tile i's four k16 steps, hi then lo per step. sx / sl: token g's staged row (nullptr: token ≥ M).
// lo: whether the inputs have a lo part — warp-uniform, so every lane issues the same mma.sync (a lane
// whose token is past M multiplies zeros; branching on sl would leave the warp diverged at mma.sync).
__device__ __forceinline__ void mma_tile(float (&d)[4], const uint32_t (&w)[kTileWords], const Chain& c, int i,
                                         const uint16_t* sx, const uint16_t* sl, bool lo, int t) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int64_t k = c.kb + static_cast<int64_t>(i) * kGemmBlockK + 16 * s + 2 * t;
    const bool in0 = sx && k < c.ke, in1 = sx && k + 8 < c.ke;
    const uint32_t af[4] = {w[4 * s], w[4 * s + 1], w[4 * s + 2], w[4 * s + 3]};
    const uint32_t b0 = in0 ? *reinterpret_cast<const uint32_t*>(sx + k) : 0u;
    const uint32_t b1 = in1 ? *reinterpret_cast<const uint32_t*>(sx + k + 8) : 0u;
    mma_bf16(d, af, b0, b1);
    if (lo) {
      const uint32_t l0 = in0 && sl ? *reinterpret_cast<const uint32_t*>(sl + k) : 0u;
      const uint32_t l1 = in1 && sl ? *reinterpret_cast<const uint32_t*>(sl + k + 8) : 0u;
      mma_bf16(d, af, l0, l1);
    }
  }
}

// prefetch: gemm_bf16_prefetch_bytes (the grid's first bytes of W into L2 before the wait).
// kDepth: 64-wide K tiles of W in registers per warp (MOESQ_WA_DEPTH).
template <int kDepth>
__global__ void __launch_bounds__(kMaxThreads) gemm_bf16_wa_kernel(GemmBf16Args a, int64_t prefetch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  const int slices = gemm_bf16_chain_slices(a);
  const CtaShape shape = cta_shape(slices);
  const int tile = warp / shape.per_tile, first = warp % shape.per_tile;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * shape.tiles + tile) * 16;
  auto chain_of = [&](int sl) {
    Chain c;
    c.v0 = n0 + g < a.N, c.v1 = n0 + g + 8 < a.N;
    c.w0 = a.w + (c.v0 ? n0 + g : 0) * a.K, c.w1 = a.w + (c.v1 ? n0 + g + 8 : 0) * a.K;
    c.kb = static_cast<int64_t>(sl) * kGemmSplitK;
    c.ke = slices > 1 ? min(a.K, c.kb + kGemmSplitK) : a.K;
    c.tiles = static_cast<int>((c.ke - c.kb + kGemmBlockK - 1) / kGemmBlockK);
    return c;
  };
  const bool has_chain = first < slices && n0 < a.N;

  // Before the wait: the L2 prefetch and this warp's first kDepth − 1 tiles (W only).
  prefetch_l2_grid(a.w, prefetch, kGemmPrefetchCtas);
  uint32_t w[kDepth][kTileWords];
  Chain c = chain_of(first);
  if (has_chain) {
#pragma unroll
    for (int j = 0; j < kDepth - 1; ++j)
      if (j < c.tiles) load_tile(w[j], c, j, t);
  }
  pdl_enter();

  // The tokens' rows (hi, then lo) into shared memory, row stride K + kRowPad.
  extern __shared__ __align__(16) unsigned char s_raw[];
  const int64_t ld = a.K + kRowPad;
  uint16_t* s_x = reinterpret_cast<uint16_t*>(s_raw);
  uint16_t* s_l = a.x_lo ? s_x + a.M * ld : nullptr;
  float* s_part = reinterpret_cast<float*>(s_raw + (a.x_lo ? 2 : 1) * a.M * ld * sizeof(uint16_t));
  const int64_t vecs = a.K / 8;
  for (int64_t v = threadIdx.x; v < a.M * vecs; v += blockDim.x) {
    const int64_t m = v / vecs, k = (v % vecs) * 8;
    *reinterpret_cast<uint4*>(s_x + m * ld + k) = *reinterpret_cast<const uint4*>(a.x + m * a.K + k);
    if (s_l) *reinterpret_cast<uint4*>(s_l + m * ld + k) = *reinterpret_cast<const uint4*>(a.x_lo + m * a.K + k);
  }
  __syncthreads();
  const uint16_t* sx = g < a.M ? s_x + g * ld : nullptr;
  const uint16_t* sl = g < a.M && s_l ? s_l + g * ld : nullptr;

  for (int sl_i = first; has_chain && sl_i < slices; sl_i += shape.per_tile) {
    if (sl_i != first) {
      c = chain_of(sl_i);
#pragma unroll
      for (int j = 0; j < kDepth - 1; ++j)
        if (j < c.tiles) load_tile(w[j], c, j, t);
    }
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i0 = 0; i0 < c.tiles; i0 += kDepth) {
#pragma unroll
      for (int j = 0; j < kDepth; ++j) {
        const int i = i0 + j;
        if (i >= c.tiles) break;
        if (i + kDepth - 1 < c.tiles) load_tile(w[(j + kDepth - 1) % kDepth], c, i + kDepth - 1, t);
        mma_tile(d, w[j], c, i, sx, sl, s_l != nullptr, t);
      }
    }
    // d: (row g, token 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). One slice: straight out (a sum of
    // one slice is that slice, the split path's bits).
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int r = g + 8 * (q >> 1), tok = 2 * t + (q & 1);
      if (slices > 1) {
        s_part[((tile * slices + sl_i) * 8 + tok) * 16 + r] = d[q];
        continue;
      }
      const int64_t n = n0 + r;
      if (tok >= a.M || n >= a.N) continue;
      store_y(a, tok * a.ldy + n, d[q]);
    }
  }
  if (slices == 1) return;
  __syncthreads();
  for (int v = threadIdx.x; v < shape.tiles * 8 * 16; v += blockDim.x) {
    const int tl = v / 128, tok = v / 16 % 8, r = v % 16;
    const int64_t n = (static_cast<int64_t>(blockIdx.x) * shape.tiles + tl) * 16 + r;
    if (tok >= a.M || n >= a.N) continue;
    const float* p = s_part + static_cast<int64_t>(tl) * slices * 128;
    float val = p[tok * 16 + r];
    for (int s = 1; s < slices; ++s) val = __fadd_rn(val, p[(s * 8 + tok) * 16 + r]);  // slice order
    store_y(a, tok * a.ldy + n, val);
  }
}

}  // namespace

bool gemm_bf16_wa_fits(const GemmBf16Args& a) {
  return a.M >= 1 && a.M <= kGemmWaMaxM && a.groups == 1 && !a.counts && !a.fused_topk && a.K % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && (!a.x_lo || reinterpret_cast<uintptr_t>(a.x_lo) % 16 == 0) &&
         reinterpret_cast<uintptr_t>(a.w) % 4 == 0 && smem_bytes(a) <= kMaxSmem;
}

bool gemm_bf16_wa_enabled(const GemmBf16Args& a) {
  static const bool on = env_switch("MOESQ_SMALL_M_WA", false);
  return on && gemm_bf16_wa_fits(a);
}

int gemm_bf16_wa_depth() {
  static const int depth = static_cast<int>(env_int("MOESQ_WA_DEPTH", 3, 3, 6));
  return depth >= 6 ? 6 : depth >= 4 ? 4 : 3;
}

namespace {
template <int kDepth>
void launch_wa(const GemmBf16Args& a, cudaStream_t stream) {
  static const bool configured = [] {  // once per instance: not a stream operation, so capture-safe
    MOESQ_CUDA_CHECK(
        cudaFuncSetAttribute(gemm_bf16_wa_kernel<kDepth>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    return true;
  }();
  (void)configured;
  const CtaShape shape = cta_shape(gemm_bf16_chain_slices(a));
  const int64_t row_tiles = (a.N + 15) / 16;
  const int64_t ctas = (row_tiles + shape.tiles - 1) / shape.tiles;
  MOESQ_CHECK(ctas <= 0x7fffffff, "gemm_bf16: N=", a.N, " too large");
  const int64_t prefetch = std::max<int64_t>(gemm_bf16_prefetch_bytes(a), 0);
  launch_pdl("gemm_bf16_wa_kernel", gemm_bf16_wa_kernel<kDepth>, dim3(static_cast<unsigned>(ctas)),
             dim3(static_cast<unsigned>(32 * shape.tiles * shape.per_tile)), smem_bytes(a), stream, a, prefetch);
}
}  // namespace

void gemm_bf16_wa(const GemmBf16Args& a, cudaStream_t stream) { gemm_bf16_wa(a, stream, gemm_bf16_wa_depth()); }

void gemm_bf16_wa(const GemmBf16Args& a, cudaStream_t stream, int depth) {
  switch (depth) {
    case 6: return launch_wa<6>(a, stream);
    case 4: return launch_wa<4>(a, stream);
    default: return launch_wa<3>(a, stream);
  }
}

}  // namespace moesq::ops::detail
