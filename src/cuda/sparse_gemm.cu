// Grouped sparse GEMM kernel for paired 4:8 NVFP4 experts (sparse_gemm.cuh), Hopper sm_90a.
//
// Each warp streams its weight tiles straight from HBM into registers (four 16-byte loads per lane
// per 16×256 chunk, moe/kernel_layout.h), decodes E2M1 codes × UE4M3 scales to EXACT bf16 in
// registers, expands the ordered-metadata nibbles to the register form of mma.sp, and issues
// mma.sp::ordered_metadata m16n8k32 with fp32 accumulators; activations (the B operand) are read
// from the per-expert batch with one 16-byte load per lane per k-step. A persistent grid walks the
// (expert, m-block, n-block) tiles; the tile count per expert, ceil(count_e / BLOCK_N)·m_blocks, is
// computed on the device from the device-side counts, so the host never syncs.
//
// Non-obvious decision: E2M1 → bf16 without a lookup table, and with the packed bits pre-placed. The
// kernel layout stores each code's sign and magnitude bits where one shift of the lane's code word
// and a mask turn them into the bf16 bits of value·2^-126 (code 1 = 0.5 lands on the bf16 subnormal
// 2^-127): 9 integer ops for 8 codes. ONE exact bf16x2 multiply by the block scale pre-multiplied by
// 2^119 (cvt.f16x2.e4m3x2 + shift + add for both rows of a k-step) finishes the decode as
// value·scale·2^-7 (≤ 6 significant bits, in [2^-17, 21]: exact), and the epilogue multiplies the
// fp32 accumulator by 2^7 (exact). fma.rn.bf16x2 (−0 addend) keeps subnormal inputs.
#include "cuda/sparse_gemm.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "cuda/cuda_check.cuh"

namespace moesq::cuda {

namespace {

constexpr int kMaxExperts = 1024;  // prefix array in shared memory
constexpr int kWarps = 4;          // warps per CTA (all share the CTA's token tile)
constexpr int kChunkBytes = 1408;  // moe::kChunkBytes: one 16-row × 256-K chunk
constexpr int kChunkK = 256;
constexpr int kSteps = 8;          // mma k-steps (32 K each) per chunk
constexpr int kScaleOff = 1024;    // moe::kChunkCodeBytes
constexpr int kMetaOff = 1152;     // + moe::kChunkScaleBytes
constexpr float kAccUnscale = 128.0f;  // 2^7: undoes 2^-126 (code shift) · 2^119 (scale bias), exactly
constexpr uint32_t kBf16x2NegZero = 0x80008000u;
constexpr uint32_t kF16ToBf16x2p119 = 0x73807380u;  // (127 + 119 − 15) << 7 in both halves

// Streamed-once weights: non-coherent load that does not allocate in L1 (keeps L1 for X).
__device__ __forceinline__ uint4 ld_stream(const uint8_t* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ uint32_t u4get(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a compile-time constant after unrolling
}

// a·b exactly (+(−0) keeps the sign of zero products); fma keeps bf16 subnormal inputs.
__device__ __forceinline__ uint32_t bf16x2_mul_exact(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(kBf16x2NegZero));
  return d;
}

// Two UE4M3 codes (bits 0–7: row g, bits 8–15: row g+8) → bf16x2 {s_g·2^119, s_g8·2^119}, exact.
// cvt.f16x2.e4m3x2 (one instruction) gives exact f16 — every UE4M3 value, subnormals included, is a
// NORMAL f16 with the 3 mantissa bits on top — so a shift by 3 moves each half onto the bf16 field
// (the high half's zero low mantissa bits fill the gap: no mask) and one add re-biases the exponent
// 15 → 127 + 119. Code 0 becomes 2^104, not 0: the layout stores code 0 for every weight of a
// zero-scale block (moe/kernel_layout.cpp), and 0 · 2^104 = 0.
__device__ __forceinline__ uint32_t ue4m3x2_to_bf16x2_x2p119(uint32_t c2) {
  uint32_t f;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(f) : "h"(static_cast<unsigned short>(c2)));
  return (f >> 3) + kF16ToBf16x2p119;
}

// The 16-bit half `odd` of a stored metadata word → the 32-bit mma.sp operand: byte j holds stored
// nibble j of step 2p (low) and 2p+1 (high); each nibble serves both halves of its group after the
// [0,2,4,6,1,3,5,7] permutation, so it is doubled (× 0x11 on nibbles alone in their bytes: no carry).
__device__ __forceinline__ uint32_t meta_of_step(uint32_t word, int odd) {
  return ((word >> (4 * odd)) & 0x0F0F0F0Fu) * 0x11u;
}

// One lane's A fragment of one k-step, as value·scale·2^-7: register k = (a_2k, a_2k+1); registers
// 0, 2 are row g (scale pair lane 0), 1, 3 row g+8 (lane 1); s2 as from ue4m3x2_to_bf16x2_x2p119.
// The code word's bits already sit where one shift (two for k = 2, 3) and a mask put them on the
// bf16 bits of value·2^-126 (magnitude at bits 6–8 — code 1 = 0.5 lands on the subnormal 2^-127 —
// sign at 15, +16 for the high half; moe/kernel_layout.cpp code_bit_pos): 9 integer ops for 8 codes.
__device__ __forceinline__ void decode_a(uint32_t w, uint32_t s2, uint32_t a[4]) {
  constexpr uint32_t kMag = 0x01C001C0u, kSign = 0x80008000u;
  const uint32_t s_g = __byte_perm(s2, 0, 0x1010), s_g8 = __byte_perm(s2, 0, 0x3232);
  a[0] = bf16x2_mul_exact(w & (kMag | kSign), s_g);
  a[1] = bf16x2_mul_exact((w << 3) & (kMag | kSign), s_g8);
  a[2] = bf16x2_mul_exact(((w >> 3) & kMag) | ((w << 1) & kSign), s_g);
  a[3] = bf16x2_mul_exact(((w << 6) & kMag) | ((w << 2) & kSign), s_g8);
}

// D += A·B, A 16×32 2:4-sparse bf16 (4 regs + metadata, selector 0), B 32×8 bf16, D fp32.
__device__ __forceinline__ void mma_sp(float c[4], const uint32_t a[4], const uint4& b, uint32_t meta) {
  asm("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(b.z), "r"(b.w), "r"(meta));
}

struct ChunkRegs {
  uint4 codes[2];  // steps 0–3, 4–7: one 32-bit code word per step
  uint4 scales;    // [8 steps][row g, row g+8] UE4M3
  uint4 meta;      // [4 step pairs][4 B] ordered-metadata nibbles (lanes t = 0, 1)
};

__device__ __forceinline__ void load_chunk(ChunkRegs& r, const uint8_t* chunk, int lane) {
  const int g = lane >> 2, t = lane & 3;
  r.codes[0] = ld_stream(chunk + lane * 16);
  r.codes[1] = ld_stream(chunk + 512 + lane * 16);
  r.scales = ld_stream(chunk + kScaleOff + g * 16);
  r.meta = ld_stream(chunk + kMetaOff + (g * 2 + (t & 1)) * 16);  // lanes t = 2, 3: ignored copy
}

// Pulls one chunk into L2 ahead of its register load (no register cost): the register double
// buffer alone leaves only one chunk per m-tile in flight, too few bytes to cover HBM latency.
__device__ __forceinline__ void prefetch_l2(const uint8_t* p) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(kChunkBytes) : "memory");
}
constexpr int kL2Ahead = 4;  // chunks per m-tile requested ahead into L2

// kMT m16 tiles × kNT n8 tiles per warp. Explicit instances below (6, see sparse_gemm()).
// Memory-bound decode instances ask for as many CTAs per SM as v4 reached (registers ≤ 128 for 4 CTAs
// = 16 warps, ≤ 168 for 3): left free, ptxas took 136 at 32×8 and 193 at 32×16 (bench/NOTES.md v5).
template <int kMT, int kNT>
constexpr int kMinCtasPerSm = kMT * kNT <= 2 ? 4 : (kNT == 2 ? 3 : 1);

template <int kMT, int kNT>
__global__ void __launch_bounds__(kWarps * 32, kMinCtasPerSm<kMT, kNT>) grouped_sparse_gemm_kernel(SparseGemmArgs a) {
  static_assert(kMT >= 1 && kMT <= 4 && kNT >= 1 && kNT <= 4, "bounded tile instances");
  static_assert(kMT * kL2Ahead <= 32, "one L2 prefetch per lane at tile start");
  constexpr bool kPrefetch = kMT <= 2;  // register double-buffer of the next chunk's weights
  // Measured (bench/NOTES.md v2): an activation register prefetch (+64 regs) and the L2 prefetch
  // both slowed the decode tiles; the L2 prefetch sped up the compute-bound tiles by ~15%.
  constexpr bool kPrefetchB = false;
  constexpr bool kL2 = kNT >= 4;
  constexpr int kBlockMTiles = kWarps * kMT;
  constexpr int kBlockN = 8 * kNT;
  __shared__ int s_prefix[kMaxExperts + 1];
  __shared__ int s_count[kMaxExperts];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int E = a.num_experts;
  const int MT = static_cast<int>(a.M_pad / 16), KC = static_cast<int>(a.K_pad / kChunkK);
  const int m_blocks = (MT + kBlockMTiles - 1) / kBlockMTiles;

  // Tiles per expert → exclusive prefix (warp 0, 32 experts per shuffle scan); clamped counts cached.
  if (warp == 0) {
    int running = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + lane;
      int v = 0;
      if (e < E) {
        const int c = min(a.counts[e], a.capacity);
        s_count[e] = c;
        v = m_blocks * ((c + kBlockN - 1) / kBlockN);
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
  const int total = s_prefix[E];

  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    int lo = 0, hi = E - 1;  // expert = largest e with s_prefix[e] <= tile
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s_prefix[mid] <= tile) lo = mid;
      else hi = mid - 1;
    }
    const int e = lo;
    const int count = s_count[e];
    const int n_blocks = (count + kBlockN - 1) / kBlockN;
    const int local = tile - s_prefix[e];
    const int mb = local / n_blocks, nb = local % n_blocks;  // n-blocks of one m-block run side by side
    const int mt0 = (mb * kWarps + warp) * kMT;
    if (mt0 >= MT) continue;  // this warp has no rows in the last m-block

    const uint8_t* w_e = a.w + static_cast<size_t>(e) * MT * KC * kChunkBytes;
    if (kL2 && lane < kMT * kL2Ahead && lane % kL2Ahead < KC)
      prefetch_l2(w_e + (static_cast<size_t>(min(mt0 + lane / kL2Ahead, MT - 1)) * KC + lane % kL2Ahead) * kChunkBytes);
    const uint8_t* wp[kMT];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) wp[mi] = w_e + static_cast<size_t>(min(mt0 + mi, MT - 1)) * KC * kChunkBytes;
    const uint16_t* xp[kNT];
    bool xv[kNT];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int tok = nb * kBlockN + nt * 8 + g;
      xv[nt] = tok < count;
      xp[nt] = a.x + (static_cast<size_t>(e) * a.capacity + (xv[nt] ? tok : 0)) * a.K_pad + 8 * t;
    }
    // Epilogue factors, loaded now so their latency hides under the K loop.
    const float inv_w = a.w_inv_gamma[e];
    float alpha[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tok = nb * kBlockN + nt * 8 + 2 * t + j;
        alpha[nt][j] = inv_w * ((a.x_inv_scale && tok < count)
                                    ? a.x_inv_scale[static_cast<size_t>(e) * a.capacity + tok] : 1.0f);
      }

    float acc[kMT][kNT][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[mi][nt][j] = 0.0f;

    auto load_b = [&](uint4 (&b)[kSteps], int kc) {  // kNT == 1: one chunk of activations
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
        b[s] = xv[0] ? __ldg(reinterpret_cast<const uint4*>(xp[0] + kc * kChunkK + s * 32)) : make_uint4(0, 0, 0, 0);
    };
    ChunkRegs cur[kMT];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) load_chunk(cur[mi], wp[mi], lane);
    uint4 bcur[kPrefetchB ? kSteps : 1];
    if constexpr (kPrefetchB) load_b(bcur, 0);

#pragma unroll 1
    for (int kc = 0; kc < KC; ++kc) {
      if (kL2 && lane < kMT && kc + kL2Ahead < KC) prefetch_l2(w_e + (static_cast<size_t>(min(mt0 + lane, MT - 1)) * KC + kc + kL2Ahead) * kChunkBytes);
      ChunkRegs nxt[kPrefetch ? kMT : 1];
      uint4 bnxt[kPrefetchB ? kSteps : 1];
      if constexpr (kPrefetch) {
        if (kc + 1 < KC) {
#pragma unroll
          for (int mi = 0; mi < kMT; ++mi) load_chunk(nxt[mi], wp[mi] + (kc + 1) * kChunkBytes, lane);
          if constexpr (kPrefetchB) load_b(bnxt, kc + 1);
        }
      }
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        uint4 b[kNT];
        if constexpr (kPrefetchB) {
          b[0] = bcur[s];
        } else {
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
            b[nt] = xv[nt] ? __ldg(reinterpret_cast<const uint4*>(xp[nt] + kc * kChunkK + s * 32)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          const uint32_t sw = u4get(cur[mi].scales, s >> 1) >> (16 * (s & 1));
          uint32_t af[4];
          decode_a(u4get(cur[mi].codes[s >> 2], s & 3), ue4m3x2_to_bf16x2_x2p119(sw), af);
          const uint32_t meta = meta_of_step(u4get(cur[mi].meta, s >> 1), s & 1);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) mma_sp(acc[mi][nt], af, b[nt], meta);
        }
      }
      if constexpr (kPrefetch) {
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) cur[mi] = nxt[mi];
        if constexpr (kPrefetchB) {
#pragma unroll
          for (int s = 0; s < kSteps; ++s) bcur[s] = bnxt[s];
        }
      } else if (kc + 1 < KC) {
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) load_chunk(cur[mi], wp[mi] + (kc + 1) * kChunkBytes, lane);
      }
    }

    // Epilogue: α = (1/γ_w)·(1/γ_a) in that order (moe::grouped_sparse_gemm_ref), bf16 and/or fp32.
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tok = nb * kBlockN + nt * 8 + 2 * t + j;
        if (tok >= count) continue;
        const size_t slot = static_cast<size_t>(e) * a.capacity + tok;
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          if (mt0 + mi >= MT) continue;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t m = static_cast<int64_t>(mt0 + mi) * 16 + g + 8 * h;
            if (m >= a.M) continue;
            const float v = (acc[mi][nt][2 * h + j] * kAccUnscale) * alpha[nt][j];
            const size_t idx = slot * a.ldy + m;
            if (a.y) a.y[idx] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
            if (a.y_f32) a.y_f32[idx] = v;
          }
        }
      }
    }
  }
}

struct DeviceInfo {
  int num_sms = 0;
};
const DeviceInfo& device_info() {
  static DeviceInfo info = [] {
    DeviceInfo d;
    int dev = 0;
    MOESQ_CUDA_CHECK(cudaGetDevice(&dev));
    MOESQ_CUDA_CHECK(cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, dev));
    return d;
  }();
  return info;
}

template <int kMT, int kNT>
void launch(const SparseGemmArgs& a, const GemmConfig& c, int max_tokens, cudaStream_t stream) {
  static int ctas_per_sm = [] {
    int n = 0;
    MOESQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, grouped_sparse_gemm_kernel<kMT, kNT>,
                                                                   kWarps * 32, 0));
    return n > 0 ? n : 1;
  }();
  const int64_t m_blocks = (a.M_pad / 16 + kWarps * kMT - 1) / (kWarps * kMT);
  const int64_t max_tiles = a.num_experts * m_blocks * ((max_tokens + 8 * kNT - 1) / (8 * kNT));
  int64_t grid = c.grid > 0 ? c.grid : static_cast<int64_t>(ctas_per_sm) * device_info().num_sms;
  grid = std::max<int64_t>(1, std::min(grid, max_tiles));
  grouped_sparse_gemm_kernel<kMT, kNT><<<static_cast<unsigned>(grid), kWarps * 32, 0, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("grouped_sparse_gemm_kernel");
}

}  // namespace

std::string GemmConfig::str() const {
  std::ostringstream os;
  os << "sparse_gemm mma.sp m16n8k32: BLOCK_M=" << warps * 16 * m_tiles << " BLOCK_N=" << 8 * n_tiles
     << " (warp " << 16 * m_tiles << "x" << 8 * n_tiles << ", " << warps << " warps) grid="
     << (grid > 0 ? std::to_string(grid) : std::string("occupancy×SMs"));
  return os.str();
}

GemmConfig sparse_gemm_heuristic(int num_experts, int64_t M, int64_t K_pad, int max_tokens) {
  GemmConfig c;
  if (max_tokens <= 8) c.n_tiles = 1;
  else if (max_tokens <= 16) c.n_tiles = 2;
  else c.n_tiles = 4;
  if (c.n_tiles == 4) {
    // Compute-bound side (bench/NOTES.md v2 sweep): 32×32 warp tiles (register double buffer) win up
    // to 256 tokens per expert, 64×32 (each decoded A fragment reused 4×) above.
    c.m_tiles = max_tokens <= 256 ? 2 : 4;
  } else {
    // Memory-bound decode: 2 m16 tiles per warp keeps more bytes in flight, unless that leaves
    // fewer than ~2 tiles per SM (few experts): then halve BLOCK_M to spread the weights wider.
    const int64_t m_blocks2 = (M + 16 * kWarps * 2 - 1) / (16 * kWarps * 2);
    const int64_t tiles2 = num_experts * m_blocks2 * ((max_tokens + 8 * c.n_tiles - 1) / (8 * c.n_tiles));
    c.m_tiles = tiles2 < 2 * device_info().num_sms ? 1 : 2;
  }
  (void)K_pad;
  const char* env = std::getenv("MOESQ_PRINT_CONFIG");
  if (env && std::strcmp(env, "1") == 0)
    std::fprintf(stderr, "[moesq] E=%d M=%lld K_pad=%lld max_tokens=%d → %s\n", num_experts,
                 static_cast<long long>(M), static_cast<long long>(K_pad), max_tokens, c.str().c_str());
  return c;
}

void sparse_gemm(const SparseGemmArgs& a, int max_tokens, cudaStream_t stream, const GemmConfig* config) {
  MOESQ_CHECK(a.num_experts > 0 && a.num_experts <= kMaxExperts, "sparse_gemm: num_experts=", a.num_experts,
              " not in [1, ", kMaxExperts, "]");
  MOESQ_CHECK(a.M > 0 && a.M_pad >= a.M && a.M_pad % 16 == 0 && a.K_pad > 0 && a.K_pad % kChunkK == 0,
              "sparse_gemm: M=", a.M, " M_pad=", a.M_pad, " K_pad=", a.K_pad, " (M_pad % 16, K_pad % 256 required)");
  MOESQ_CHECK(a.w && a.w_inv_gamma && a.x && a.counts && (a.y || a.y_f32) && a.ldy >= a.M, "sparse_gemm: missing ",
              "buffer or ldy=", a.ldy, " < M=", a.M);
  MOESQ_CHECK(a.capacity >= 0 && max_tokens >= 0, "sparse_gemm: capacity=", a.capacity, " max_tokens=", max_tokens);
  if (a.capacity == 0 || max_tokens == 0) return;
  max_tokens = std::min(max_tokens, a.capacity);
  const GemmConfig c = config ? *config : sparse_gemm_heuristic(a.num_experts, a.M, a.K_pad, max_tokens);
  MOESQ_CHECK(c.warps == kWarps, "sparse_gemm: config warps=", c.warps, " (only ", kWarps, " is built)");
  if (c.m_tiles == 1 && c.n_tiles == 1) return launch<1, 1>(a, c, max_tokens, stream);
  if (c.m_tiles == 2 && c.n_tiles == 1) return launch<2, 1>(a, c, max_tokens, stream);
  if (c.m_tiles == 1 && c.n_tiles == 2) return launch<1, 2>(a, c, max_tokens, stream);
  if (c.m_tiles == 2 && c.n_tiles == 2) return launch<2, 2>(a, c, max_tokens, stream);
  if (c.m_tiles == 2 && c.n_tiles == 4) return launch<2, 4>(a, c, max_tokens, stream);
  if (c.m_tiles == 4 && c.n_tiles == 4) return launch<4, 4>(a, c, max_tokens, stream);
  MOESQ_FAIL("sparse_gemm: no kernel instance for ", c.str(), " (built: 16x8, 32x8, 16x16, 32x16, 32x32, 64x32 per warp)");
}

}  // namespace moesq::cuda
