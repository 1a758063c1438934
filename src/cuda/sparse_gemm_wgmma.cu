// Grouped sparse GEMM for paired 4:8 NVFP4 experts, wgmma.mma_async.sp variant (Hopper sm_90a), for
// the compute-bound regime (hundreds of tokens per expert). Same contract and arithmetic as the
// mma.sp kernel (sparse_gemm.cuh; CPU twin moe::grouped_sparse_gemm_ref).
//
// CTA = 2 warpgroups, tile = 128 weight rows (BLOCK_M) × BLOCK_N tokens of one expert. Per 64-wide
// K block:
//   * activations (B, K-major, moe::ActLayout::kKMajor) go global → shared memory with 16-byte
//     cp.async into a 128-byte-swizzled [BLOCK_N][64] bf16 tile, kStages deep, issued kStages − 2
//     K blocks ahead; token rows past the expert's count are zero-filled (never read);
//   * each warp decodes ITS 16 weight rows straight from registers (sparse_decode.cuh, the same
//     exact bf16 A fragment and metadata register as mma.sp) — A never touches shared memory —
//     and the warpgroup issues two wgmma.mma_async.sp m64nNk32 (A from registers, B by descriptor).
// A warpgroup keeps one K block of wgmma in flight (wait_group 1) while it decodes the next, so
// decode and tensor work overlap. The weight stream (one 1408-byte chunk per warp per 256 K, register
// double buffer + L2 prefetch) and the activation stream both run ACROSS tile boundaries of the
// persistent loop, so a new tile does not start with an exposed memory latency.
//
// Non-obvious decision: A from registers, not shared memory. A sparse m64nNk32 wgmma reads 64·N bytes
// of B per N/2 cycles — the full 128 B/cycle of shared memory on its own; A through shared memory as
// well would make every tile shared-memory bound. The decode happens in registers anyway.
#include "cuda/sparse_gemm_wgmma.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

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
constexpr int kL2AheadChunks = 3;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination without reading src.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
// cp.async writes are generic-proxy writes; the tensor cores read through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

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

template <int kBN, int kStages>
__global__ void __launch_bounds__(kThreads, 1) grouped_sparse_gemm_wgmma_kernel(SparseGemmArgs a) {
  static_assert(kStages >= 3, "the producer runs kStages - 2 K blocks ahead");
  constexpr int kAhead = kStages - 2;
  constexpr uint32_t kStageBytes = kBN * kBlockK * 2;
  constexpr int kCopiesPerThread = kBN * (kBlockK / 8) / kThreads;
  static_assert(kCopiesPerThread * kThreads == kBN * (kBlockK / 8), "whole 16-byte pieces per thread");
  extern __shared__ uint8_t smem_raw[];
  __shared__ int s_prefix[kMaxExperts + 1];
  __shared__ int s_count[kMaxExperts];
  __shared__ float s_alpha[2][kBN];
  const uint32_t b_base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // swizzle atoms need 1024-B alignment

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int E = a.num_experts;
  const int MT = static_cast<int>(a.M_pad / 16), KC = static_cast<int>(a.K_pad / kChunkK);
  const int m_blocks = (MT + kWarpsPerCta - 1) / kWarpsPerCta;

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
    if (lane == 0) s_prefix[0] = 0;
  }
  __syncthreads();

  // Activation producer: one call per consumer K block (plus kAhead up front); it walks the same
  // tile sequence kAhead K blocks ahead and always commits a group, so group c = K block c.
  int p_tile = blockIdx.x, p_kb = 0, p_stage = 0;
  Tile pt = tile_at<kBN>(p_tile, s_prefix, s_count, E);
  const int KB = KC * kKBlocksPerChunk;
  auto produce = [&]() {
    if (pt.e >= 0) {
      const uint16_t* xe = a.x + static_cast<size_t>(pt.e) * a.capacity * a.K_pad + p_kb * kBlockK;
      const uint32_t dst = b_base + p_stage * kStageBytes;
#pragma unroll
      for (int i = 0; i < kCopiesPerThread; ++i) {
        const int idx = threadIdx.x + i * kThreads, r = idx >> 3, u = idx & 7;
        const int tok = pt.nb * kBN + r;
        const bool ok = tok < pt.count;
        cp_async16(dst + r * 128 + ((u ^ (r & 7)) << 4), xe + static_cast<size_t>(ok ? tok : 0) * a.K_pad + u * 8, ok);
      }
      if (++p_kb == KB) {
        p_kb = 0;
        p_tile += gridDim.x;
        pt = tile_at<kBN>(p_tile, s_prefix, s_count, E);
      }
    }
    cp_async_commit();
    p_stage = p_stage + 1 == kStages ? 0 : p_stage + 1;
  };

  // Weight stream of this warp's 16 rows, one chunk ahead of the consumer, across tiles.
  auto chunk_ptr = [&](const Tile& tl, int kc) {
    const int mt = min(tl.mb * kWarpsPerCta + warp, MT - 1);  // rows past M_pad: computed, not stored
    return a.w + ((static_cast<size_t>(tl.e) * MT + mt) * KC + kc) * kChunkBytes;
  };
  int w_tile = blockIdx.x, w_kc = 0;
  Tile wt = tile_at<kBN>(w_tile, s_prefix, s_count, E);
  auto next_chunk = [&](ChunkRegs& r) {
    if (wt.e < 0) return;
    load_chunk(r, chunk_ptr(wt, w_kc), lane);
    if (++w_kc == KC) {
      w_kc = 0;
      w_tile += gridDim.x;
      wt = tile_at<kBN>(w_tile, s_prefix, s_count, E);
    }
  };

  int tile = blockIdx.x, stage = 0, parity = 0;
  Tile ct = tile_at<kBN>(tile, s_prefix, s_count, E);
#pragma unroll 1
  for (int i = 0; i < kAhead; ++i) produce();
  ChunkRegs wcur, wnxt;
  next_chunk(wcur);
  float acc[kBN / 2];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.0f;

  while (ct.e >= 0) {
    if (threadIdx.x < kBN) {  // epilogue factors α = (1/γ_w)·(1/γ_a); read after the K loop's barriers
      const int tok = ct.nb * kBN + threadIdx.x;
      s_alpha[parity][threadIdx.x] =
          a.w_inv_gamma[ct.e] *
          ((a.x_inv_scale && tok < ct.count) ? a.x_inv_scale[static_cast<size_t>(ct.e) * a.capacity + tok] : 1.0f);
    }
#pragma unroll 1
    for (int kc = 0; kc < KC; ++kc) {
      next_chunk(wnxt);
      if (lane == 0 && kc + kL2AheadChunks < KC) prefetch_l2(chunk_ptr(ct, kc + kL2AheadChunks));
#pragma unroll
      for (int q = 0; q < kKBlocksPerChunk; ++q) {
        cp_async_wait<kAhead - 1>();  // this thread's copies of K block (kc, q) have landed
        fence_proxy_async();
        __syncthreads();  // … everyone's; and every warpgroup retired the wgmma of two K blocks ago
        produce();        // refills the stage those wgmma read
        uint32_t a0[4], a1[4];
        const uint32_t scales = u4get(wcur.scales, q);  // steps 2q (low half), 2q + 1 (high half)
        decode_a(u4get(wcur.codes[q >> 1], (2 * q) & 3), ue4m3x2_to_bf16x2_x2p119(scales), a0);
        decode_a(u4get(wcur.codes[q >> 1], (2 * q + 1) & 3), ue4m3x2_to_bf16x2_x2p119(scales >> 16), a1);
        const uint32_t meta = u4get(wcur.meta, q);
        const uint64_t desc = desc_k_major_sw128(b_base + stage * kStageBytes);
        wgmma_fence();
        Wgmma<kBN>::mma(acc, a0, desc, meta_of_step(meta, 0), kc > 0 || q > 0);
        Wgmma<kBN>::mma(acc, a1, desc + (64 >> 4), meta_of_step(meta, 1), 1);
        wgmma_commit();
        wgmma_wait<1>();
        stage = stage + 1 == kStages ? 0 : stage + 1;
      }
      wcur = wnxt;
    }
    wgmma_wait<0>();
    fence_acc(acc);

    // Epilogue: register 4j + 2h + h2 holds row g + 8h, token column 8j + 2t + h2 of the warp's tile.
    const int mt = ct.mb * kWarpsPerCta + warp;
    if (mt < MT) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int n = 8 * j + 2 * t + h2, tok = ct.nb * kBN + n;
          if (tok >= ct.count) continue;
          const float alpha = s_alpha[parity][n];
          const size_t row0 = (static_cast<size_t>(ct.e) * a.capacity + tok) * a.ldy;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t m = static_cast<int64_t>(mt) * 16 + g + 8 * h;
            if (m >= a.M) continue;
            const float v = (acc[4 * j + 2 * h + h2] * kAccUnscale) * alpha;
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
  cp_async_wait<0>();  // only empty groups can be pending here; leave nothing in flight
}

template <int kBN, int kStages>
void launch(const SparseGemmArgs& a, int max_tokens, int num_sms, int grid_override, cudaStream_t stream) {
  const int smem = kStages * kBN * kBlockK * 2 + 1024;
  static const bool configured = [smem] {
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(grouped_sparse_gemm_wgmma_kernel<kBN, kStages>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  const int64_t m_blocks = (a.M_pad / 16 + kWarpsPerCta - 1) / kWarpsPerCta;
  const int64_t max_tiles = a.num_experts * m_blocks * ((max_tokens + kBN - 1) / kBN);
  int64_t grid = grid_override > 0 ? grid_override : num_sms;
  grid = std::max<int64_t>(1, std::min(grid, max_tiles));
  grouped_sparse_gemm_wgmma_kernel<kBN, kStages><<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("grouped_sparse_gemm_wgmma_kernel");
}

}  // namespace

bool wgmma_instance_exists(int block_n, int stages) {
  return (block_n == 128 && (stages == 4 || stages == 6)) || (block_n == 256 && stages == 4);
}

void launch_sparse_gemm_wgmma(const SparseGemmArgs& a, const GemmConfig& c, int max_tokens, int num_sms,
                              cudaStream_t stream) {
  const int block_n = 8 * c.n_tiles;
  if (block_n == 128 && c.stages == 4) return launch<128, 4>(a, max_tokens, num_sms, c.grid, stream);
  if (block_n == 128 && c.stages == 6) return launch<128, 6>(a, max_tokens, num_sms, c.grid, stream);
  if (block_n == 256 && c.stages == 4) return launch<256, 4>(a, max_tokens, num_sms, c.grid, stream);
  MOESQ_FAIL("sparse_gemm: no wgmma.sp instance for ", c.str(), " (built: BLOCK_N 128 × 4 or 6 stages, 256 × 4)");
}

}  // namespace moesq::cuda::detail
