// Grouped sparse GEMM, mma.sp kernel, for paired 4:8 NVFP4 experts (sparse_gemm.h), Hopper sm_90a.
//
// Each warp streams its weight tiles straight from HBM into registers (four 16-byte loads per lane
// per 16×256 chunk, format/kernel_layout.h), unpacks E2M1 codes × UE4M3 scales to EXACT bf16 in
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
// 2^119 (cvt.f16x2.e4m3x2 + shift + add for both rows of a k-step) finishes the unpack as
// value·scale·2^-7 (≤ 6 significant bits, in [2^-17, 21]: exact), and the epilogue multiplies the
// fp32 accumulator by 2^7 (exact). fma.rn.bf16x2 (−0 addend) keeps subnormal inputs.
#include "ops/sparse_gemm/sparse_gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/sparse_gemm/weight_unpack.cuh"
#include "ops/sparse_gemm/sparse_gemm_routes.cuh"
#include "ops/sparse_gemm/sparse_gemm_wgmma.cuh"
#include "ops/sparse_gemm/tile_schedule.cuh"

namespace moesq::ops {

namespace {

constexpr int kMaxExperts = 1024;  // prefix array in shared memory
constexpr int kWarps = 4;          // warps per CTA (all share the CTA's token tile)
// From this many tokens per expert on, the heuristic picks the wgmma.sp kernel (measured: bench/NOTES.md).
constexpr int kWgmmaMinTokens = 128;
using namespace detail;

constexpr int kL2Ahead = 4;  // chunks per m-tile requested ahead into L2

// kMT m16 tiles × kNT n8 tiles per warp. Explicit instances: the 5 of sparse_gemm() (the ones the
// heuristic can choose). Memory-bound (small-N) instances ask for 4 CTAs per SM (registers ≤ 128 =
// 16 warps) or 3 (≤ 168): left free, ptxas takes 136 at 32×8 and 193 at 32×16 (bench/NOTES.md).
template <int kMT, int kNT>
constexpr int kMinCtasPerSm = kMT * kNT <= 2 ? 4 : (kNT == 2 ? 3 : 1);

template <int kMT, int kNT>
__global__ void __launch_bounds__(kWarps * 32, kMinCtasPerSm<kMT, kNT>) grouped_sparse_gemm_kernel(SparseGemmArgs a) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  static_assert(kMT >= 1 && kMT <= 4 && kNT >= 1 && kNT <= 4, "bounded tile instances");
  static_assert(kMT * kL2Ahead <= 32, "one L2 prefetch per lane at tile start");
  constexpr bool kPrefetch = kMT <= 2;  // register double-buffer of the next chunk's weights
  // L2 prefetch of weight chunks ahead: it pays only on the compute-bound tiles (bench/NOTES.md);
  // activations are not prefetched into registers (measured slower on the memory-bound tiles).
  constexpr bool kL2 = kNT >= 4;
  constexpr int kBlockMTiles = kWarps * kMT;
  constexpr int kBlockN = 8 * kNT;
  __shared__ int s_prefix[kMaxExperts + 1];
  __shared__ int s_count[kMaxExperts];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int E = a.num_experts;
  const int MT = static_cast<int>(a.M_pad / 16), KC = static_cast<int>(a.K_pad / kChunkK);
  const int m_blocks = (MT + kBlockMTiles - 1) / kBlockMTiles;

  if (warp == 0) build_tile_prefix(a.counts, a.capacity, E, m_blocks, kBlockN, s_prefix, s_count, lane);
  __syncthreads();
  const int total = s_prefix[E];

  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const Tile tl = tile_at(tile, s_prefix, s_count, E, kBlockN);
    const int e = tl.e, count = tl.count, mb = tl.mb, nb = tl.nb;
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
    const float inv_w_hi = a.w_inv_gamma_hi ? a.w_inv_gamma_hi[e] : inv_w;
    float inv_a[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int tok = nb * kBlockN + nt * 8 + 2 * t + j;
        inv_a[nt][j] = (a.x_inv_scale && tok < count) ? a.x_inv_scale[static_cast<size_t>(e) * a.capacity + tok] : 1.0f;
      }

    float acc[kMT][kNT][4];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[mi][nt][j] = 0.0f;

    ChunkRegs cur[kMT];
#pragma unroll
    for (int mi = 0; mi < kMT; ++mi) load_chunk(cur[mi], wp[mi], lane);

#pragma unroll 1
    for (int kc = 0; kc < KC; ++kc) {
      if (kL2 && lane < kMT && kc + kL2Ahead < KC) prefetch_l2(w_e + (static_cast<size_t>(min(mt0 + lane, MT - 1)) * KC + kc + kL2Ahead) * kChunkBytes);
      ChunkRegs nxt[kPrefetch ? kMT : 1];
      if constexpr (kPrefetch) {
        if (kc + 1 < KC) {
#pragma unroll
          for (int mi = 0; mi < kMT; ++mi) load_chunk(nxt[mi], wp[mi] + (kc + 1) * kChunkBytes, lane);
        }
      }
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        uint4 b[kNT];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          b[nt] = xv[nt] ? __ldg(reinterpret_cast<const uint4*>(xp[nt] + kc * kChunkK + s * 32)) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          const uint32_t sw = u4get(cur[mi].scales, s >> 1) >> (16 * (s & 1));
          uint32_t af[4];
          unpack_a_fragment(u4get(cur[mi].codes[s >> 2], s & 3), ue4m3x2_to_bf16x2_x2p119(sw), af);
          const uint32_t meta = meta_of_step(u4get(cur[mi].meta, s >> 1), s & 1);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) mma_sp(acc[mi][nt], af, b[nt], meta);
        }
      }
      if constexpr (kPrefetch) {
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) cur[mi] = nxt[mi];
      } else if (kc + 1 < KC) {
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) load_chunk(cur[mi], wp[mi] + (kc + 1) * kChunkBytes, lane);
      }
    }

    // Epilogue: α = (1/γ_w)·(1/γ_a) in that order (sparse_gemm_ref), bf16 and/or fp32.
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
          // m_split is a multiple of 16: one γ per m16 tile.
          const float alpha = (static_cast<int64_t>(mt0 + mi) * 16 >= a.m_split && a.w_inv_gamma_hi ? inv_w_hi : inv_w) *
                              inv_a[nt][j];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t m = static_cast<int64_t>(mt0 + mi) * 16 + g + 8 * h;
            if (m >= a.M) continue;
            const float v = (acc[mi][nt][2 * h + j] * kAccUnscale) * alpha;
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
  launch_pdl("grouped_sparse_gemm_kernel", grouped_sparse_gemm_kernel<kMT, kNT>, dim3(static_cast<unsigned>(grid)),
             dim3(kWarps * 32), 0, stream, a);
}

}  // namespace

std::string GemmConfig::str() const {
  std::ostringstream os;
  if (variant == GemmVariant::kWgmmaSp) {
    os << "sparse_gemm wgmma.sp m64n" << 8 * n_tiles << "k32: BLOCK_M=" << warps / 4 * 64 * m64_tiles_per_warpgroup
       << " BLOCK_N=" << 8 * n_tiles << " (" << warps / 4 << " warpgroups, A from registers) stages=" << stages
       << " grid=" << (grid > 0 ? std::to_string(grid) : std::string("SMs"));
    return os.str();
  }
  os << "sparse_gemm mma.sp m16n8k32: BLOCK_M=" << warps * 16 * m16_tiles_per_warp << " BLOCK_N=" << 8 * n_tiles
     << " (warp " << 16 * m16_tiles_per_warp << "x" << 8 * n_tiles << ", " << warps << " warps) grid="
     << (grid > 0 ? std::to_string(grid) : std::string("occupancy×SMs"));
  return os.str();
}

GemmConfig wgmma_config(int block_m, int block_n, int stages) {
  GemmConfig c;
  c.variant = GemmVariant::kWgmmaSp;
  c.m64_tiles_per_warpgroup = block_m / 128;
  c.n_tiles = block_n / 8;
  c.warps = 8;
  c.stages = stages;
  return c;
}

format::ActLayout sparse_gemm_act_layout(const GemmConfig& config) {
  return config.variant == GemmVariant::kWgmmaSp ? format::ActLayout::kKMajor : format::ActLayout::kMmaFragment;
}

GemmConfig sparse_gemm_heuristic(int num_experts, int64_t M, int64_t K_pad, int max_tokens) {
  GemmConfig c;
  if (max_tokens >= kWgmmaMinTokens) {
    // Compute-bound: wgmma.sp. 128×256 tiles from 512 tokens; below, 256×128 (half the activation
    // re-reads) unless that leaves fewer than ~3 tiles per SM (few experts), where 128×256 fills the
    // GPU better (closing sweep, bench/NOTES.md: G = 8 and 32 vs 128 and 384 at N = 256).
    const int64_t tiles_256x128 = num_experts * ((M + 255) / 256) * ((max_tokens + 127) / 128);
    c = max_tokens >= 512 || tiles_256x128 < 3 * device_info().num_sms ? wgmma_config(128, 256)
                                                                        : wgmma_config(256, 128);
  } else if (max_tokens > 16) {
    // Between the memory-bound and compute-bound regimes: 32×16 warp tiles beat 32×32 in 6 of the 7 rows with 32–64 tokens
    // of a closing sweep (bench/results/final_bench_gemm.json; bench/NOTES.md).
    c.n_tiles = 2;
    c.m16_tiles_per_warp = 2;
  } else {
    // Memory-bound (small N): 2 m16 tiles per warp keeps more bytes in flight, unless that leaves
    // fewer than ~2 tiles per SM (few experts): then halve BLOCK_M to spread the weights wider.
    c.n_tiles = max_tokens <= 8 ? 1 : 2;
    const int64_t m_blocks2 = (M + 16 * kWarps * 2 - 1) / (16 * kWarps * 2);
    const int64_t tiles2 = num_experts * m_blocks2 * ((max_tokens + 8 * c.n_tiles - 1) / (8 * c.n_tiles));
    c.m16_tiles_per_warp = tiles2 < 2 * device_info().num_sms ? 1 : 2;
  }
  (void)K_pad;
  const char* env = std::getenv("MOESQ_PRINT_CONFIG");
  if (env && std::strcmp(env, "1") == 0)
    std::fprintf(stderr, "[moesq] E=%d M=%lld K_pad=%lld max_tokens=%d → %s\n", num_experts,
                 static_cast<long long>(M), static_cast<long long>(K_pad), max_tokens, c.str().c_str());
  return c;
}

bool sparse_gemm_runs_routes(const SparseGemmArgs& a, int max_tokens, const GemmConfig* config) {
  if (a.capacity == 0 || max_tokens == 0) return false;
  const GemmConfig c =
      config ? *config : sparse_gemm_heuristic(a.num_experts, a.M, a.K_pad, std::min(max_tokens, a.capacity));
  return c.variant == GemmVariant::kMmaSp && c.warps == kWarps && detail::sparse_gemm_routes_fits(a);
}

void sparse_gemm(const SparseGemmArgs& a, int max_tokens, cudaStream_t stream, const GemmConfig* config) {
  MOESQ_CHECK(a.num_experts > 0 && a.num_experts <= kMaxExperts, "sparse_gemm: num_experts=", a.num_experts,
              " not in [1, ", kMaxExperts, "]");
  MOESQ_CHECK(a.M > 0 && a.M_pad >= a.M && a.M_pad % 16 == 0 && a.K_pad > 0 && a.K_pad % kChunkK == 0,
              "sparse_gemm: M=", a.M, " M_pad=", a.M_pad, " K_pad=", a.K_pad, " (M_pad % 16, K_pad % 256 required)");
  MOESQ_CHECK(a.w && a.w_inv_gamma && a.x && a.counts && (a.y || a.y_f32) && a.ldy >= a.M, "sparse_gemm: missing ",
              "buffer or ldy=", a.ldy, " < M=", a.M);
  MOESQ_CHECK(a.capacity >= 0 && max_tokens >= 0, "sparse_gemm: capacity=", a.capacity, " max_tokens=", max_tokens);
  MOESQ_CHECK(!a.w_inv_gamma_hi || (a.m_split > 0 && a.m_split < a.M && a.m_split % 16 == 0), "sparse_gemm: m_split=",
              a.m_split, " must be a multiple of 16 in (0, M=", a.M, ") when w_inv_gamma_hi is given");
  MOESQ_CHECK(!a.fused_swiglu || sparse_gemm_runs_routes(a, max_tokens, config), "sparse_gemm: fused_swiglu "
              "given where the routes kernel does not run (capacity ", a.capacity, ", max_tokens ", max_tokens, ")");
  if (a.capacity == 0 || max_tokens == 0) return;
  max_tokens = std::min(max_tokens, a.capacity);
  const GemmConfig c = config ? *config : sparse_gemm_heuristic(a.num_experts, a.M, a.K_pad, max_tokens);
  MOESQ_CHECK(a.x_layout == sparse_gemm_act_layout(c), "sparse_gemm: activations are in ",
              format::act_layout_name(a.x_layout), " layout but ", c.str(), " reads ",
              format::act_layout_name(sparse_gemm_act_layout(c)), " (dispatch with sparse_gemm_act_layout(config))");
  if (c.variant == GemmVariant::kWgmmaSp) {
    MOESQ_CHECK(c.warps == 8 && detail::wgmma_instance_exists(c.m64_tiles_per_warpgroup, 8 * c.n_tiles, c.stages),
                "sparse_gemm: no wgmma.sp instance for ", c.str());
    return detail::launch_sparse_gemm_wgmma(a, c, max_tokens, device_info().num_sms, stream);
  }
  MOESQ_CHECK(c.warps == kWarps, "sparse_gemm: config warps=", c.warps, " (only ", kWarps, " is built)");
  // The routes given and capacity ≤ routes_max_tokens: the routes kernel, the same bits
  // (sparse_gemm_routes.cu).
  if (detail::sparse_gemm_routes_fits(a)) return detail::launch_sparse_gemm_routes(a, stream);
  if (c.m16_tiles_per_warp == 1 && c.n_tiles == 1) return launch<1, 1>(a, c, max_tokens, stream);
  if (c.m16_tiles_per_warp == 2 && c.n_tiles == 1) return launch<2, 1>(a, c, max_tokens, stream);
  if (c.m16_tiles_per_warp == 1 && c.n_tiles == 2) return launch<1, 2>(a, c, max_tokens, stream);
  if (c.m16_tiles_per_warp == 2 && c.n_tiles == 2) return launch<2, 2>(a, c, max_tokens, stream);
  if (c.m16_tiles_per_warp == 4 && c.n_tiles == 4) return launch<4, 4>(a, c, max_tokens, stream);
  MOESQ_FAIL("sparse_gemm: no kernel instance for ", c.str(), " (built: 16x8, 32x8, 16x16, 32x16, 64x32 per warp)");
}

}  // namespace moesq::ops
