// Grouped sparse GEMM for paired 4:8 NVFP4 experts, wgmma.mma_async.sp variant (Hopper sm_90a), for
// the compute-bound regime (hundreds of tokens per expert). Same contract and arithmetic as the
// mma.sp kernel (sparse_gemm.cuh; CPU twin moe::grouped_sparse_gemm_ref).
//
// CTA = 2 warpgroups (256 threads, one CTA per SM), tile = BLOCK_M = 128·kMW weight rows × BLOCK_N
// tokens of one expert. Per 64-wide K block:
//   * warp 0 (also a consumer) produces kStages − 2 K blocks ahead: one TMA of the K-major B tile
//     (moe::ActLayout::kKMajor, box {64 K, BLOCK_N tokens} of the 3-D [E][capacity][K_pad] tensor,
//     128-byte swizzle) and, on the last K block of each 256-K chunk, a bulk copy of each m16 tile's
//     next 1408-byte weight chunk, all completing on the stage's "full" mbarrier;
//   * each warp decodes ITS weight rows from shared memory to the exact bf16 A fragment in registers
//     (sparse_decode.cuh; same fragment and metadata register as mma.sp), and each warpgroup issues
//     wgmma.mma_async.sp m64nNk32 (A from registers, B by descriptor);
//   * one CTA barrier per K block, after the stage's "full" wait, certifies that both warpgroups
//     retired (wait_group 1) the wgmma of two K blocks ago, whose stage the producer then refills.
//     (Per-stage "empty" mbarriers instead of the barrier measured slower: bench/NOTES.md v9.)
// The decode runs one K block ahead of its wgmma, and both streams (B, weights) run ACROSS tile
// boundaries of the persistent loop, so a new tile starts without an exposed memory latency. Token
// rows past an expert's count are loaded (or zero-filled past capacity) but their output columns are
// never stored: each output column depends on its own B column only.
//
// Non-obvious decision: A from registers, not shared memory. A sparse m64nNk32 wgmma reads 64·N bytes
// of B per N/2 cycles — the full 128 B/cycle of shared memory on its own; A through shared memory as
// well would make every tile shared-memory bound. The decode happens in registers anyway.
#include "cuda/sparse_gemm_wgmma.cuh"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>

#include "cuda/cuda_check.cuh"
#include "cuda/sparse_decode.cuh"

namespace moesq::cuda::detail {

namespace {

constexpr int kMaxExperts = 1024;
constexpr int kWarpgroups = 2;
constexpr int kThreads = kWarpgroups * 128;
constexpr int kWarpsPerCta = kThreads / 32;          // warp w owns rows 16w..16w+15 of the tile
constexpr int kBlockK = 64;                          // one 128-byte swizzle row of bf16 per token
constexpr int kKBlocksPerChunk = kChunkK / kBlockK;  // 4

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 r;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr));
  return r;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}
// Makes the accumulator registers depend on the preceding wait, so no read moves above it.
template <int kN>
__device__ __forceinline__ void fence_acc(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor of a K-major bf16 tile with 128-byte swizzle: rows of 128 B,
// 8-row atoms 1024 B apart (stride byte offset), leading byte offset unused (1), layout type 1.
// Moving to the second 32-wide k-step of the 64-wide row adds 64 B to the start address.
__device__ __forceinline__ uint64_t desc_k_major_sw128(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

// D (64 × kBN fp32 per warpgroup) += A (64 × 32, 2:4 sparse, bf16, registers) · B (32 × kBN bf16,
// descriptor); scale_d = 0 → D = A·B. Sparsity selector 0 (lanes t = 0, 1 of each quad hold the
// metadata, as for mma.sp m16n8k32). Accumulator layout per warp = mma m16n8 C fragments, n8 block j
// in registers 4j..4j+3.
template <int kBN>
struct Wgmma;

template <>
struct Wgmma<128> {
  static __device__ __forceinline__ void mma(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, uint32_t meta, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %70, 0;\n"
        "wgmma.mma_async.sp.sync.aligned.m64n128k32.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, %69, 0, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "r"(scale_d));
  }
};

template <>
struct Wgmma<256> {
  static __device__ __forceinline__ void mma(float (&d)[128], const uint32_t (&a)[4], uint64_t desc, uint32_t meta, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "setp.ne.b32 p, %134, 0;\n"
        "wgmma.mma_async.sp.sync.aligned.m64n256k32.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, %133, 0, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "r"(scale_d));
  }
};
struct Tile {
  int e = -1, mb = 0, nb = 0, count = 0;  // e < 0: past the last tile
};

// Tile `tile` of the device-side schedule: expert = largest e with prefix[e] <= tile; the n-blocks
// of one m-block are consecutive, so CTAs running side by side share weights in L2.
template <int kBN>
__device__ __forceinline__ Tile tile_at(int tile, const int* s_prefix, const int* s_count, int E) {
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
  const int n_blocks = (t.count + kBN - 1) / kBN;
  const int local = tile - s_prefix[lo];
  t.mb = local / n_blocks;
  t.nb = local % n_blocks;
  return t;
}

// mbarrier helpers (shared::cta, 64-bit barrier words).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// TMA: box {64 K, kBN tokens, 1 expert} of the [E][capacity][K_pad] activations → swizzled smem;
// rows past `capacity` are zero-filled by the hardware.
__device__ __forceinline__ void tma_load_b(uint32_t dst, const CUtensorMap* map, int k, int tok, int e, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
      "l"(map), "r"(k), "r"(tok), "r"(e), "r"(bar)
      : "memory");
}
// Bulk copy of one 1408-byte weight chunk (contiguous in the kernel layout) → smem.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// TMA store of a staged output box {64 rows, kBN tokens, 1 expert} (128-byte swizzle) → y; rows ≥ M and
// tokens ≥ capacity are clipped by the hardware.
__device__ __forceinline__ void tma_store_y(const CUtensorMap* map, int m, int tok, int e, uint32_t src) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(map),
               "r"(m), "r"(tok), "r"(e), "r"(src)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void st_shared_u16(uint32_t addr, uint16_t v) {
  asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"(v) : "memory");
}

// Weight chunks of the CTA's m16 tiles, double-buffered: [slot][m16 tile of the CTA tile][1408 B].
constexpr int kWeightSlots = 2;

// Dynamic shared memory: B stages | weight slots | output staging (2·kMW boxes of [kBN][64] bf16,
// 1024-B aligned for the swizzle), + 1024 B to align the base.
template <int kMW, int kBN, int kStages>
constexpr int weight_bytes() {
  return (kWeightSlots * kWarpsPerCta * kMW * kChunkBytes + 1023) / 1024 * 1024;
}
template <int kMW, int kBN, int kStages>
constexpr int smem_bytes() {
  return kStages * kBN * kBlockK * 2 + weight_bytes<kMW, kBN, kStages>() + 2 * kMW * kBN * 128 + 1024;
}

// kMW: m64 sub-tiles per warpgroup (BLOCK_M = 128·kMW); CTA-local m16 tile i = wg·4·kMW + 4·sub + wi
// belongs to warp 4·wg + wi.
template <int kMW, int kBN, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_sparse_gemm_wgmma_kernel(SparseGemmArgs a, const __grid_constant__ CUtensorMap x_map,
                                     const __grid_constant__ CUtensorMap y_map, int tma_store) {
  // kAhead ≤ 4: a chunk's weights are copied while the consumer is at least at the last K block of
  // the chunk two before, whose slot is then free (see produce).
  static_assert(kStages >= 3 && kStages <= 6, "the producer runs kStages - 2 (1..4) K blocks ahead");
  constexpr int kAhead = kStages - 2;
  constexpr int kBlockMTiles = kWarpsPerCta * kMW;  // m16 tiles per CTA tile
  constexpr uint32_t kStageBytes = kBN * kBlockK * 2;
  static_assert(kBlockMTiles <= 32, "one weight copy per lane of warp 0");
  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_prefix[kMaxExperts + 1];
  __shared__ int s_count[kMaxExperts];
  __shared__ float s_alpha[2][kBN];
  __shared__ alignas(8) uint64_t s_full[kStages];  // K block landed: B tile (+ a weight chunk)
  const uint32_t b_base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-B alignment
  const uint32_t w_base = b_base + kStages * kStageBytes;
  const uint32_t c_base = w_base + weight_bytes<kMW, kBN, kStages>();
  const uint32_t full_base = smem_addr(s_full);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wi = warp & 3;
  const int E = a.num_experts;
  const int MT = static_cast<int>(a.M_pad / 16), KC = static_cast<int>(a.K_pad / kChunkK);
  const int m_blocks = (MT + kBlockMTiles - 1) / kBlockMTiles;

  if (warp == 0) {  // tiles per expert → exclusive prefix; clamped counts cached
    int running = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + lane;
      int v = 0;
      if (e < E) {
        const int c = min(a.counts[e], a.capacity);
        s_count[e] = c;
        v = m_blocks * ((c + kBN - 1) / kBN);
      }
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
      }
      if (e < E) s_prefix[e + 1] = running + v;
      running += __shfl_sync(0xffffffffu, v, 31);
    }
    if (lane == 0) {
      s_prefix[0] = 0;
      for (int i = 0; i < kStages; ++i) mbar_init(full_base + 8 * i, 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
  }
  __syncthreads();

  // Producer (warp 0, which also computes): one call per consumer K block (plus kAhead up front),
  // walking the CTA's tile sequence kAhead K blocks ahead. Lane 0 arms the stage's barrier with the
  // bytes to come and issues the B tile's TMA; on a chunk's last K block, lanes 0..kBlockMTiles−1
  // also bulk-copy the NEXT chunk of the weight stream (one chunk ahead of the consumer, across
  // tiles) on the same barrier.
  int p_tile = blockIdx.x, p_kb = 0, p_stage = 0;
  Tile pt = tile_at<kBN>(p_tile, s_prefix, s_count, E);
  int w_tile = blockIdx.x, w_kc = 0, w_slot = 0;
  Tile wt = pt;
  const int KB = KC * kKBlocksPerChunk;
  auto produce = [&](bool first) {
    if (warp != 0) return;
    if (pt.e >= 0) {
      // Weights ride on the LAST K block of a chunk (the next chunk of the stream, decoded right after
      // that K block's wait) — and on the very first K block (the first chunk).
      const bool weights = (first || p_kb % kKBlocksPerChunk == kKBlocksPerChunk - 1) && wt.e >= 0;
      const uint32_t bar = full_base + 8 * p_stage;
      if (lane == 0) {
        mbar_arrive_expect_tx(bar, kStageBytes + (weights ? kBlockMTiles * kChunkBytes : 0));
        tma_load_b(b_base + p_stage * kStageBytes, &x_map, p_kb * kBlockK, pt.nb * kBN, pt.e, bar);
      }
      __syncwarp();
      if (weights && lane < kBlockMTiles) {
        const int mt = min(wt.mb * kBlockMTiles + lane, MT - 1);  // rows past M_pad: computed, never stored
        bulk_load(w_base + (w_slot * kBlockMTiles + lane) * kChunkBytes,
                  a.w + ((static_cast<size_t>(wt.e) * MT + mt) * KC + w_kc) * kChunkBytes, kChunkBytes, bar);
      }
      if (weights) {
        w_slot ^= 1;
        if (++w_kc == KC) {
          w_kc = 0;
          w_tile += gridDim.x;
          wt = tile_at<kBN>(w_tile, s_prefix, s_count, E);
        }
      }
      if (++p_kb == KB) {
        p_kb = 0;
        p_tile += gridDim.x;
        pt = tile_at<kBN>(p_tile, s_prefix, s_count, E);
      }
    }
    p_stage = p_stage + 1 == kStages ? 0 : p_stage + 1;
  };

  auto m_tile = [&](const Tile& tl, int sub) { return tl.mb * kBlockMTiles + wg * 4 * kMW + 4 * sub + wi; };
  int tile = blockIdx.x, stage = 0, parity = 0, r_slot = 0;
  uint32_t phase = 0;  // parity of the stage barriers' current phase, flips when `stage` wraps
  Tile ct = tile_at<kBN>(tile, s_prefix, s_count, E);
#pragma unroll 1
  for (int i = 0; i < kAhead; ++i) produce(i == 0);  // K blocks 0 .. kAhead − 1
  float acc[kMW][kBN / 2];
#pragma unroll
  for (int sub = 0; sub < kMW; ++sub)
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[sub][i] = 0.0f;

  // A fragments are decoded one K block AHEAD of their wgmma (set q & 1 feeds K block q of a chunk),
  // so the decode overlaps the tensor work already queued. Weight registers: the chunk's scales and
  // metadata, and the codes of 4 steps.
  uint32_t af[2][kMW][2][4], mf[2][kMW][2];
  uint4 scales[kMW], meta[kMW], codes[kMW];
  auto decode_kblock = [&](int slot, int qq, uint32_t (&a_out)[kMW][2][4], uint32_t (&m_out)[kMW][2]) {
#pragma unroll
    for (int sub = 0; sub < kMW; ++sub) {
      const uint32_t chunk = w_base + (slot * kBlockMTiles + wg * 4 * kMW + 4 * sub + wi) * kChunkBytes;
      if (qq == 0) {
        scales[sub] = ld_shared_v4(chunk + kScaleOff + g * 16);
        meta[sub] = ld_shared_v4(chunk + kMetaOff + (g * 2 + (t & 1)) * 16);
      }
      if ((qq & 1) == 0) codes[sub] = ld_shared_v4(chunk + (qq >> 1) * 512 + lane * 16);
      const uint32_t sc = u4get(scales[sub], qq);  // steps 2qq (low half), 2qq + 1 (high half)
      decode_a(u4get(codes[sub], (2 * qq) & 3), ue4m3x2_to_bf16x2_x2p119(sc), a_out[sub][0]);
      decode_a(u4get(codes[sub], (2 * qq + 1) & 3), ue4m3x2_to_bf16x2_x2p119(sc >> 16), a_out[sub][1]);
      const uint32_t mw = u4get(meta[sub], qq);
      m_out[sub][0] = meta_of_step(mw, 0);
      m_out[sub][1] = meta_of_step(mw, 1);
    }
  };
  if (ct.e >= 0) {
    mbar_wait(full_base, 0);  // K block 0 carries the first weight chunk
    decode_kblock(0, 0, af[0], mf[0]);
  }

  while (ct.e >= 0) {
    // Epilogue factors α = (1/γ_w)·(1/γ_a), loaded now and stored to shared memory a K block later
    // (the load latency hides under it); the epilogue reads them after the K loop's barriers.
    float alpha_in = 0.0f;
    if (threadIdx.x < kBN) {
      const int tok = ct.nb * kBN + threadIdx.x;
      alpha_in = a.w_inv_gamma[ct.e] *
                 ((a.x_inv_scale && tok < ct.count) ? a.x_inv_scale[static_cast<size_t>(ct.e) * a.capacity + tok] : 1.0f);
    }
#pragma unroll 1
    for (int kc = 0; kc < KC; ++kc) {
#pragma unroll
      for (int q = 0; q < kKBlocksPerChunk; ++q) {
        mbar_wait(full_base + 8 * stage, phase);  // B tile of K block (kc, q) has landed
        __syncthreads();  // every warpgroup retired the wgmma of two K blocks ago: its stage is free
        const uint64_t desc = desc_k_major_sw128(b_base + stage * kStageBytes);
        wgmma_fence();
#pragma unroll
        for (int sub = 0; sub < kMW; ++sub) {
          Wgmma<kBN>::mma(acc[sub], af[q & 1][sub][0], desc, mf[q & 1][sub][0], kc > 0 || q > 0);
          Wgmma<kBN>::mma(acc[sub], af[q & 1][sub][1], desc + (64 >> 4), mf[q & 1][sub][1], 1);
        }
        wgmma_commit();
        produce(false);  // K block kAhead ahead, into the stage the wgmma of two K blocks ago read
        if (q == 1 && kc == 0 && threadIdx.x < kBN) s_alpha[parity][threadIdx.x] = alpha_in;
        wgmma_wait<1>();  // the previous K block's wgmma retired: its A set is free
        // Next K block's A (the next chunk's first one — possibly the next tile's — after q = 3;
        // that chunk came with K block (kc, 3), waited for at the top of this iteration).
        if (q + 1 < kKBlocksPerChunk) decode_kblock(r_slot, q + 1, af[(q + 1) & 1], mf[(q + 1) & 1]);
        else if (kc + 1 < KC || tile + static_cast<int>(gridDim.x) < s_prefix[E]) decode_kblock(r_slot ^ 1, 0, af[0], mf[0]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      r_slot ^= 1;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int sub = 0; sub < kMW; ++sub) fence_acc(acc[sub]);

    // Epilogue: acc[sub] register 4j + 2h + h2 holds row g + 8h of the warp's m16 tile `sub`, token
    // column 8j + 2t + h2. Tiles full in tokens are staged in shared memory per warpgroup and written
    // by TMA stores (asynchronous: the warpgroup goes on to its next tile); partial tiles and the
    // fp32 test output store element by element.
    if (tma_store && (ct.nb + 1) * kBN <= ct.count) {
      if ((threadIdx.x & 127) == 0) bulk_wait_read_all();  // this warpgroup's previous stores have read
      named_barrier(1 + wg, 128);                         // … its staging boxes
#pragma unroll
      for (int sub = 0; sub < kMW; ++sub) {
        const uint32_t box = c_base + (wg * kMW + sub) * kBN * 128;  // [kBN tokens][64 rows], swizzled
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int n = 8 * j + 2 * t + h2;
            const float alpha = s_alpha[parity][n];
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // row 16·wi + g + 8h of the box: 16-byte unit 2·wi + h
              const uint32_t addr = box + n * 128 + ((((2 * wi + h) ^ (n & 7))) << 4) + g * 2;
              st_shared_u16(addr, __bfloat16_as_ushort(__float2bfloat16_rn((acc[sub][4 * j + 2 * h + h2] * kAccUnscale) * alpha)));
            }
          }
      }
      fence_proxy_async();  // generic-proxy stores → the TMA engine's reads
      named_barrier(1 + wg, 128);
      if ((threadIdx.x & 127) == 0) {
#pragma unroll
        for (int sub = 0; sub < kMW; ++sub)
          tma_store_y(&y_map, (ct.mb * kBlockMTiles + 4 * (wg * kMW + sub)) * 16, ct.nb * kBN, ct.e,
                      c_base + (wg * kMW + sub) * kBN * 128);
        bulk_commit();
      }
    } else {
#pragma unroll
      for (int sub = 0; sub < kMW; ++sub) {
        const int mt = m_tile(ct, sub);
        if (mt >= MT) continue;
        const int64_t m0 = static_cast<int64_t>(mt) * 16 + g;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int n = 8 * j + 2 * t + h2, tok = ct.nb * kBN + n;
            if (tok >= ct.count) continue;
            const float alpha = s_alpha[parity][n];
            const size_t row0 = (static_cast<size_t>(ct.e) * a.capacity + tok) * a.ldy;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int64_t m = m0 + 8 * h;
              if (m >= a.M) continue;
              const float v = (acc[sub][4 * j + 2 * h + h2] * kAccUnscale) * alpha;
              if (a.y) a.y[row0 + m] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
              if (a.y_f32) a.y_f32[row0 + m] = v;
            }
          }
      }
    }
    tile += gridDim.x;
    ct = tile_at<kBN>(tile, s_prefix, s_count, E);
    parity ^= 1;
  }
  if (tma_store && (threadIdx.x & 127) == 0) bulk_wait_all();  // staging must outlive the stores
}

// 3-D bf16 tensor map [dim2][dim1][dim0] with row stride `ld` elements, 128-byte swizzle, box
// {64, block_n, 1}. The driver entry point is fetched once through the runtime (no libcuda link).
CUtensorMap make_map(const void* base, int64_t dim0, int64_t ld, int64_t dim1, int64_t dim2, int block_n,
                     const char* what) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MOESQ_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    MOESQ_CHECK(fn && q == cudaDriverEntryPointSuccess, "sparse_gemm: driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(dim0), static_cast<cuuint64_t>(dim1), static_cast<cuuint64_t>(dim2)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld) * 2, static_cast<cuuint64_t>(ld) * 2 * static_cast<cuuint64_t>(dim1)};
  const cuuint32_t box[3] = {kBlockK, static_cast<cuuint32_t>(block_n), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MOESQ_CHECK(r == CUDA_SUCCESS, "sparse_gemm: cuTensorMapEncodeTiled failed (", static_cast<int>(r), ") for ", what,
              "=", base, " [", dim2, "][", dim1, "][", dim0, "] ld=", ld);
  return map;
}

template <int kMW, int kBN, int kStages>
void launch(const SparseGemmArgs& a, int max_tokens, int num_sms, int grid_override, cudaStream_t stream) {
  constexpr int smem = smem_bytes<kMW, kBN, kStages>();
  static const bool configured = [] {
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(grouped_sparse_gemm_wgmma_kernel<kMW, kBN, kStages>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  MOESQ_CHECK(reinterpret_cast<uintptr_t>(a.x) % 16 == 0, "sparse_gemm: x must be 16-byte aligned for TMA");
  // Activations [E][capacity][K_pad]: 3-D so a box never crosses experts; tokens past capacity read 0.
  const CUtensorMap x_map = make_map(a.x, a.K_pad, a.K_pad, a.capacity, a.num_experts, kBN, "x");
  // Output through TMA stores when it is bf16 only and its rows are 16-byte aligned.
  const bool tma_store = a.y && !a.y_f32 && a.ldy % 8 == 0 && reinterpret_cast<uintptr_t>(a.y) % 16 == 0;
  CUtensorMap y_map{};
  if (tma_store) y_map = make_map(a.y, a.M, a.ldy, a.capacity, a.num_experts, kBN, "y");
  const int64_t m_blocks = (a.M_pad / 16 + kWarpsPerCta * kMW - 1) / (kWarpsPerCta * kMW);
  const int64_t max_tiles = a.num_experts * m_blocks * ((max_tokens + kBN - 1) / kBN);
  int64_t grid = grid_override > 0 ? grid_override : num_sms;
  grid = std::max<int64_t>(1, std::min(grid, max_tiles));
  grouped_sparse_gemm_wgmma_kernel<kMW, kBN, kStages><<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(a, x_map, y_map,
                                                                                                     tma_store ? 1 : 0);
  MOESQ_CUDA_LAUNCH_CHECK("grouped_sparse_gemm_wgmma_kernel");
}

}  // namespace

bool wgmma_instance_exists(int m_tiles, int block_n, int stages) {
  if (m_tiles == 1 && block_n == 128) return stages == 4;
  if (m_tiles == 1 && block_n == 256) return stages == 4;
  if (m_tiles == 2 && block_n == 128) return stages == 4 || stages == 6;
  return false;
}

void launch_sparse_gemm_wgmma(const SparseGemmArgs& a, const GemmConfig& c, int max_tokens, int num_sms,
                              cudaStream_t stream) {
  const int block_n = 8 * c.n_tiles;
  if (c.m_tiles == 1 && block_n == 128 && c.stages == 4) return launch<1, 128, 4>(a, max_tokens, num_sms, c.grid, stream);
  if (c.m_tiles == 1 && block_n == 256 && c.stages == 4) return launch<1, 256, 4>(a, max_tokens, num_sms, c.grid, stream);
  if (c.m_tiles == 2 && block_n == 128 && c.stages == 4) return launch<2, 128, 4>(a, max_tokens, num_sms, c.grid, stream);
  if (c.m_tiles == 2 && block_n == 128 && c.stages == 6) return launch<2, 128, 6>(a, max_tokens, num_sms, c.grid, stream);
  MOESQ_FAIL("sparse_gemm: no wgmma.sp instance for ", c.str(),
             " (built: BLOCK_M×BLOCK_N 128×128 and 128×256 with 4 stages, 256×128 with 4 or 6)");
}

}  // namespace moesq::cuda::detail
