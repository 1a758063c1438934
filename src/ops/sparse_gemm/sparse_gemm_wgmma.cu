// Grouped sparse GEMM for paired 4:8 NVFP4 experts, wgmma.mma_async.sp variant (Hopper sm_90a), for
// the compute-bound regime (hundreds of tokens per expert). Same contract and arithmetic as the
// mma.sp kernel (sparse_gemm_mma.cu; CPU twin sparse_gemm_ref.cpp).
//
// Warp-specialized persistent CTA, one per SM: a producer warpgroup (only its warp 0 works; it hands
// its registers to the consumers with setmaxnreg) and 2 consumer warpgroups. Tile = BLOCK_M =
// 128·kMW weight rows × BLOCK_N tokens of one expert. Per 64-wide K block:
//   * the producer waits until the stage is released ("empty" mbarrier, all 8 consumer warps), then
//     TMAs the K-major B tile (format::ActLayout::kKMajor, box {64 K, BLOCK_N tokens} of the 3-D
//     [E][capacity][K_pad] tensor, 128-byte swizzle) and, on the last K block of each 256-K chunk,
//     bulk-copies each m16 tile's next 1408-byte weight chunk — all on the stage's "full" mbarrier;
//     with a tile's first K block it also publishes the tile's epilogue factors;
//   * each consumer warp unpacks ITS weight rows from shared memory to the exact bf16 A fragment in
//     registers (weight_unpack.cuh; the same fragment and metadata register as mma.sp), one K block
//     ahead of its use, and each warpgroup issues wgmma.mma_async.sp m64nNk32 (A from registers, B by
//     descriptor), keeps one K block in flight (wait_group 1) and then releases the previous stage;
//   * full tiles are staged in shared memory and written by TMA stores; partial tiles element-wise.
// No CTA-wide barrier after the start; both streams (B, weights) run ACROSS tile boundaries, so a
// new tile starts without an exposed memory latency. Token rows past an expert's count are loaded
// (or zero-filled past capacity) but their output columns are never stored: each output column
// depends on its own B column only.
//
// Non-obvious decision: A from registers, unpacked by the consumers themselves, not staged as bf16 in
// shared memory: the 2.75-bit chunk is 5.8× fewer bytes to copy than unpacked bf16, and the unpack
// instructions overlap the tensor work queued by the previous K block (bench/NOTES.md).
#include "ops/sparse_gemm/sparse_gemm_wgmma.cuh"

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/sparse_gemm/weight_unpack.cuh"
#include "ops/sparse_gemm/tile_schedule.cuh"
#include "ops/sparse_gemm/wgmma.cuh"

namespace moesq::ops::detail {

namespace {

constexpr int kMaxExperts = 1024;
constexpr int kConsumerWarpgroups = 2;
constexpr int kThreads = (1 + kConsumerWarpgroups) * 128;  // producer warpgroup + 2 consumer warpgroups
constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // setmaxnreg: 128·40 + 256·232 ≤ 64 K
constexpr int kBlockK = 64;                          // one 128-byte swizzle row of bf16 per token
constexpr int kKBlocksPerChunk = kChunkK / kBlockK;  // 4

// mbarrier helpers (shared::cta, 64-bit barrier words).
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
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
  return (kWeightSlots * kConsumerWarps * kMW * kChunkBytes + 1023) / 1024 * 1024;
}
template <int kMW, int kBN, int kStages>
constexpr int smem_bytes() {
  return kStages * kBN * kBlockK * 2 + weight_bytes<kMW, kBN, kStages>() + 2 * kMW * kBN * 128 + 1024;
}

// kMW: m64 sub-tiles per consumer warpgroup (BLOCK_M = 128·kMW); CTA-local m16 tile
// i = cw·4·kMW + 4·sub + wi belongs to warp wi of consumer warpgroup cw.
template <int kMW, int kBN, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_sparse_gemm_wgmma_kernel(SparseGemmArgs a, const __grid_constant__ CUtensorMap x_map,
                                     const __grid_constant__ CUtensorMap y_map, int tma_store) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  // A chunk's weights ride on the chunk's last K block; the producer reuses the weight slot of the
  // chunk two back once the K block 4 earlier is released, which (4 stages) is after every read of
  // that slot (see the consumer's unpack-ahead).
  static_assert(kStages == 4, "weight-slot reuse is proven for 4 stages");
  constexpr int kBlockMTiles = kConsumerWarps * kMW;  // m16 tiles per CTA tile
  constexpr uint32_t kStageBytes = kBN * kBlockK * 2;
  static_assert(kBlockMTiles <= 32, "one weight copy per lane of the producer warp");
  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_prefix[kMaxExperts + 1];
  __shared__ int s_count[kMaxExperts];
  __shared__ float s_alpha[2][kBN];  // epilogue factors per tile parity, written by the producer
  __shared__ alignas(8) uint64_t s_full[kStages];   // K block landed: B tile (+ a weight chunk)
  __shared__ alignas(8) uint64_t s_empty[kStages];  // every consumer warp retired the wgmma reading it
  const uint32_t b_base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-B alignment
  const uint32_t w_base = b_base + kStages * kStageBytes;
  const uint32_t c_base = w_base + weight_bytes<kMW, kBN, kStages>();
  const uint32_t full_base = smem_addr(s_full), empty_base = smem_addr(s_empty);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int E = a.num_experts;
  const int MT = static_cast<int>(a.M_pad / 16), KC = static_cast<int>(a.K_pad / kChunkK);
  const int KB = KC * kKBlocksPerChunk;
  const int m_blocks = (MT + kBlockMTiles - 1) / kBlockMTiles;

  if (warp == 0) {
    build_tile_prefix(a.counts, a.capacity, E, m_blocks, kBN, s_prefix, s_count, lane);
    if (lane == 0) {
      for (int i = 0; i < kStages; ++i) {
        mbar_init(full_base + 8 * i, 1);
        mbar_init(empty_base + 8 * i, kConsumerWarps);
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
  }
  __syncthreads();

  if (warp < 4) {
    // ---- Producer warpgroup (registers handed to the consumers); only warp 0 works. ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == 0) {
    // Walks the CTA's tile sequence: per K block, wait until the stage is released (the K block
    // kStages earlier), arm its "full" barrier with the bytes to come, TMA the B tile; on a chunk's
    // last K block (and on the very first K block) also bulk-copy the NEXT chunk of the weight
    // stream — one chunk ahead of the consumers, across tiles — on the same barrier.
    int w_tile = blockIdx.x, w_kc = 0, w_slot = 0, stage = 0, count = 0, parity = 0;
    Tile wt = tile_at(w_tile, s_prefix, s_count, E, kBN);
#pragma unroll 1
    for (int tile = blockIdx.x;; tile += gridDim.x, parity ^= 1) {
      const Tile pt = tile_at(tile, s_prefix, s_count, E, kBN);
      if (pt.e < 0) break;
#pragma unroll 1
      for (int kb = 0; kb < KB; ++kb, ++count) {
        if (count >= kStages) mbar_wait(empty_base + 8 * stage, ((count - kStages) / kStages) & 1);
        if (kb == 0) {
          // Epilogue factors 1/γ_a of the tile's tokens (the consumers form α = (1/γ_w)·(1/γ_a) with
          // their m16 tile's 1/γ_w), published with its first K block. The
          // previous reader of s_alpha[parity] (the tile two back) finished its epilogue before it
          // released the K block just waited for (KB ≥ 4).
          for (int n = lane; n < kBN; n += 32) {
            const int tok = pt.nb * kBN + n;
            s_alpha[parity][n] = (a.x_inv_scale && tok < pt.count)
                                     ? a.x_inv_scale[static_cast<size_t>(pt.e) * a.capacity + tok]
                                     : 1.0f;
          }
          __syncwarp();  // the lanes' stores precede lane 0's arrive (release) below
        }
        const bool weights = (count == 0 || kb % kKBlocksPerChunk == kKBlocksPerChunk - 1) && wt.e >= 0;
        const uint32_t bar = full_base + 8 * stage;
        if (lane == 0) {
          mbar_arrive_expect_tx(bar, kStageBytes + (weights ? kBlockMTiles * kChunkBytes : 0));
          tma_load_b(b_base + stage * kStageBytes, &x_map, kb * kBlockK, pt.nb * kBN, pt.e, bar);
        }
        __syncwarp();
        if (weights) {
          if (lane < kBlockMTiles) {
            const int mt = min(wt.mb * kBlockMTiles + lane, MT - 1);  // rows past M_pad: computed, never stored
            bulk_load(w_base + (w_slot * kBlockMTiles + lane) * kChunkBytes,
                      a.w + ((static_cast<size_t>(wt.e) * MT + mt) * KC + w_kc) * kChunkBytes, kChunkBytes, bar);
          }
          w_slot ^= 1;
          if (++w_kc == KC) {
            w_kc = 0;
            w_tile += gridDim.x;
            wt = tile_at(w_tile, s_prefix, s_count, E, kBN);
          }
        }
        stage = stage + 1 == kStages ? 0 : stage + 1;
      }
    }
    }  // warp 0
  } else {
  // ---- Consumer warpgroups ----
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int cw = (warp >> 2) - 1, wi = warp & 3, ct_id = threadIdx.x - 128 * (cw + 1);  // ct_id: 0..127
  auto m_tile = [&](const Tile& tl, int sub) { return tl.mb * kBlockMTiles + cw * 4 * kMW + 4 * sub + wi; };
  // 1/γ_w of m16 tile `mt` of expert e (m_split is a multiple of 16: one γ per tile).
  auto w_inv_of = [&](int mt, int e) {
    return a.w_inv_gamma_hi && static_cast<int64_t>(mt) * 16 >= a.m_split ? a.w_inv_gamma_hi[e] : a.w_inv_gamma[e];
  };
  int tile = blockIdx.x, stage = 0, parity = 0, r_slot = 0, consumed = 0;
  uint32_t phase = 0;  // parity of the stage barriers' current phase, flips when `stage` wraps
  Tile ct = tile_at(tile, s_prefix, s_count, E, kBN);
  float acc[kMW][kBN / 2];
#pragma unroll
  for (int sub = 0; sub < kMW; ++sub)
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[sub][i] = 0.0f;

  // A fragments are unpacked one K block AHEAD of their wgmma (set q & 1 feeds K block q of a chunk),
  // so the unpack overlaps the tensor work already queued. Weight registers: the chunk's scales and
  // metadata, and the codes of 4 steps.
  uint32_t af[2][kMW][2][4], mf[2][kMW][2];
  uint4 scales[kMW], meta[kMW], codes[kMW];
  auto unpack_kblock = [&](int slot, int qq, uint32_t (&a_out)[kMW][2][4], uint32_t (&m_out)[kMW][2]) {
#pragma unroll
    for (int sub = 0; sub < kMW; ++sub) {
      const uint32_t chunk = w_base + (slot * kBlockMTiles + cw * 4 * kMW + 4 * sub + wi) * kChunkBytes;
      if (qq == 0) {
        scales[sub] = ld_shared_v4(chunk + kScaleOff + g * 16);
        meta[sub] = ld_shared_v4(chunk + kMetaOff + (g * 2 + (t & 1)) * 16);
      }
      if ((qq & 1) == 0) codes[sub] = ld_shared_v4(chunk + (qq >> 1) * 512 + lane * 16);
      const uint32_t sc = u4get(scales[sub], qq);  // steps 2qq (low half), 2qq + 1 (high half)
      unpack_a_fragment(u4get(codes[sub], (2 * qq) & 3), ue4m3x2_to_bf16x2_x2p119(sc), a_out[sub][0]);
      unpack_a_fragment(u4get(codes[sub], (2 * qq + 1) & 3), ue4m3x2_to_bf16x2_x2p119(sc >> 16), a_out[sub][1]);
      const uint32_t mw = u4get(meta[sub], qq);
      m_out[sub][0] = meta_of_step(mw, 0);
      m_out[sub][1] = meta_of_step(mw, 1);
    }
  };
  if (ct.e >= 0) {
    mbar_wait(full_base, 0);  // K block 0 carries the first weight chunk
    unpack_kblock(0, 0, af[0], mf[0]);
  }

  while (ct.e >= 0) {
#pragma unroll 1
    for (int kc = 0; kc < KC; ++kc) {
#pragma unroll
      for (int q = 0; q < kKBlocksPerChunk; ++q) {
        mbar_wait(full_base + 8 * stage, phase);  // B tile (and any weight chunk) of K block (kc, q) landed
        const uint64_t desc = desc_k_major_sw128(b_base + stage * kStageBytes);
        wgmma_fence();
#pragma unroll
        for (int sub = 0; sub < kMW; ++sub) {
          Wgmma<kBN>::mma(acc[sub], af[q & 1][sub][0], desc, mf[q & 1][sub][0], kc > 0 || q > 0);
          Wgmma<kBN>::mma(acc[sub], af[q & 1][sub][1], desc + (64 >> 4), mf[q & 1][sub][1], 1);
        }
        wgmma_commit();
        wgmma_wait<1>();  // the previous K block's wgmma retired: release its stage, reuse its A set
        if (lane == 0 && consumed > 0) mbar_arrive(empty_base + 8 * (stage == 0 ? kStages - 1 : stage - 1));
        ++consumed;
        // Next K block's A (the next chunk's first one — possibly the next tile's — after q = 3;
        // that chunk came with K block (kc, 3), waited for at the top of this iteration).
        if (q + 1 < kKBlocksPerChunk) unpack_kblock(r_slot, q + 1, af[(q + 1) & 1], mf[(q + 1) & 1]);
        else if (kc + 1 < KC || tile + static_cast<int>(gridDim.x) < s_prefix[E]) unpack_kblock(r_slot ^ 1, 0, af[0], mf[0]);
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
    // The last K block's stage is released at the next tile's first K block (its wait_group 1).

    // Epilogue: acc[sub] register 4j + 2h + h2 holds row g + 8h of the warp's m16 tile `sub`, token
    // column 8j + 2t + h2. Tiles full in tokens are staged in shared memory per warpgroup and written
    // by TMA stores (asynchronous: the warpgroup goes on to its next tile); partial tiles and the
    // fp32 test output store element by element.
    const bool staged = tma_store && (ct.nb + 1) * kBN <= ct.count;
    if (staged && ct_id == 0) bulk_wait_read_all();  // this warpgroup's previous stores have read its boxes
    named_barrier(1 + cw, 128);                        // … (and all its warps left the previous epilogue)
    if (staged) {
#pragma unroll
      for (int sub = 0; sub < kMW; ++sub) {
        const uint32_t box = c_base + (cw * kMW + sub) * kBN * 128;  // [kBN tokens][64 rows], swizzled
        const float inv_w = w_inv_of(m_tile(ct, sub), ct.e);
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int n = 8 * j + 2 * t + h2;
            const float alpha = inv_w * s_alpha[parity][n];
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // row 16·wi + g + 8h of the box: 16-byte unit 2·wi + h
              const uint32_t addr = box + n * 128 + ((((2 * wi + h) ^ (n & 7))) << 4) + g * 2;
              st_shared_u16(addr, __bfloat16_as_ushort(__float2bfloat16_rn((acc[sub][4 * j + 2 * h + h2] * kAccUnscale) * alpha)));
            }
          }
      }
      fence_proxy_async();  // generic-proxy stores → the TMA engine's reads
      named_barrier(1 + cw, 128);
      if (ct_id == 0) {
#pragma unroll
        for (int sub = 0; sub < kMW; ++sub)
          tma_store_y(&y_map, (ct.mb * kBlockMTiles + 4 * (cw * kMW + sub)) * 16, ct.nb * kBN, ct.e,
                      c_base + (cw * kMW + sub) * kBN * 128);
        bulk_commit();
      }
    } else {
#pragma unroll
      for (int sub = 0; sub < kMW; ++sub) {
        const int mt = m_tile(ct, sub);
        if (mt >= MT) continue;
        const int64_t m0 = static_cast<int64_t>(mt) * 16 + g;
        const float inv_w = w_inv_of(mt, ct.e);
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int h2 = 0; h2 < 2; ++h2) {
            const int n = 8 * j + 2 * t + h2, tok = ct.nb * kBN + n;
            if (tok >= ct.count) continue;
            const float alpha = inv_w * s_alpha[parity][n];
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
    ct = tile_at(tile, s_prefix, s_count, E, kBN);
    parity ^= 1;
  }
  if (tma_store && ct_id == 0) bulk_wait_all();  // staging must outlive the stores
  }  // consumers
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
  const int64_t m_blocks = (a.M_pad / 16 + kConsumerWarps * kMW - 1) / (kConsumerWarps * kMW);
  const int64_t max_tiles = a.num_experts * m_blocks * ((max_tokens + kBN - 1) / kBN);
  int64_t grid = grid_override > 0 ? grid_override : num_sms;
  grid = std::max<int64_t>(1, std::min(grid, max_tiles));
  launch_pdl("grouped_sparse_gemm_wgmma_kernel", grouped_sparse_gemm_wgmma_kernel<kMW, kBN, kStages>,
             dim3(static_cast<unsigned>(grid)), dim3(kThreads), smem, stream, a, x_map, y_map,
                                                                                                     tma_store ? 1 : 0);
}

}  // namespace

bool wgmma_instance_exists(int m64_tiles_per_warpgroup, int block_n, int stages) {
  if (m64_tiles_per_warpgroup == 1 && block_n == 128) return stages == 4;
  if (m64_tiles_per_warpgroup == 1 && block_n == 256) return stages == 4;
  if (m64_tiles_per_warpgroup == 2 && block_n == 128) return stages == 4;
  return false;
}

void launch_sparse_gemm_wgmma(const SparseGemmArgs& a, const GemmConfig& c, int max_tokens, int num_sms,
                              cudaStream_t stream) {
  const int block_n = 8 * c.n_tiles;
  if (c.m64_tiles_per_warpgroup == 1 && block_n == 128 && c.stages == 4) return launch<1, 128, 4>(a, max_tokens, num_sms, c.grid, stream);
  if (c.m64_tiles_per_warpgroup == 1 && block_n == 256 && c.stages == 4) return launch<1, 256, 4>(a, max_tokens, num_sms, c.grid, stream);
  if (c.m64_tiles_per_warpgroup == 2 && block_n == 128 && c.stages == 4) return launch<2, 128, 4>(a, max_tokens, num_sms, c.grid, stream);
  MOESQ_FAIL("sparse_gemm: no wgmma.sp instance for ", c.str(),
             " (built, 4 stages: BLOCK_M×BLOCK_N 128×128, 128×256, 256×128)");
}

}  // namespace moesq::ops::detail
