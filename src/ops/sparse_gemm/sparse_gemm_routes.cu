// Grouped sparse GEMM for decode-sized batches, the routes kernel (sparse_gemm.h,
// SparseGemmArgs::route_experts; capacity ≤ routes_max_tokens). The arithmetic of the
// mma.sp kernel (sparse_gemm_mma.cu) at one n8 tile — per m16 tile the same mma.sp sequence over the
// same chunks and k-steps, the same epilogue — so the same bits; the schedule differs:
//  - a CTA is 4 warps = 4 consecutive m16 tiles of ONE hit expert: blockIdx.x = (j, m-block), j-th
//    hit expert in ascending id; no persistent loop, no tile prefix over all E counts;
//  - the hit experts come from the routes, written two kernels back, so each warp issues the loads of
//    its first 2·kPiece weight chunks BEFORE it waits for the kernel just before it (core/cuda/pdl.cuh):
//    the weight stream overlaps the dispatch (or SwiGLU) kernel and the launch gap;
//  - after the wait the expert's ≤ 8 activation rows go to shared memory once per CTA (the mma.sp
//    kernel reads them from L2 per warp and k-step); weight pieces stay double-buffered in registers;
//    an expert of more rows (capacity > 8, routes_max_tokens) runs them in chunks of 8, the weights
//    streamed again per chunk (kChunked: 2 CTAs per SM, 212 registers);
//  - in front of the down GEMM it can make those rows itself (SparseGemmArgs::fused_swiglu): each CTA
//    runs swiglu_quant's row function (swiglu_row.cuh) on the expert's gate|up rows into shared
//    memory, so the SwiGLU kernel and its round trip through global memory leave the decode step.
//
// Non-obvious decision: every CTA rebuilds the hit-expert list from the routes (≤ 8·k ids: a bitmap
// in shared memory and a popcount scan) instead of reading a list the dispatch writes, so the weights
// can move before the dispatch has finished and the dispatch stays as it is.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/sparse_gemm/sparse_gemm_routes.cuh"
#include "ops/sparse_gemm/weight_unpack.cuh"
#include "ops/swiglu_quant/swiglu_row.cuh"

namespace moesq::ops::detail {

namespace {

constexpr int kWarps = 4;        // m16 tiles per CTA, all of one expert
constexpr int kPiece = 4;        // chunks per register buffer; two buffers: 8 chunks (11 KB) in flight per warp
constexpr int kMaxExperts = 1024;
constexpr int kWords = kMaxExperts / 32;
constexpr int kRowPad = 8;       // bf16 padding per staged row: the 8 token rows start 16 B apart in the banks
// Dynamic shared memory: the SM's 227 KB less 1 KB for the kernel's static arrays (432 B): the attribute
// refuses a maximum that leaves no room for them.
constexpr int kMaxSmem = 226 * 1024;
static_assert(kWords <= 32, "one warp scans the hit bitmap's words");

// [min(capacity, kRoutesMaxTokens), K_pad + kRowPad] bf16 rows (one chunk), then (fused SwiGLU) the row
// function's [I] fp32 scratch.
size_t rows_bytes(const SparseGemmArgs& a) {
  const size_t rows = static_cast<size_t>(std::min(a.capacity, kRoutesMaxTokens));
  return (rows * static_cast<size_t>(a.K_pad + kRowPad) * sizeof(uint16_t) + 15) / 16 * 16;
}
size_t smem_bytes(const SparseGemmArgs& a) {
  return rows_bytes(a) + (a.fused_swiglu ? static_cast<size_t>(a.fused_swiglu->I) * sizeof(float) : 0);
}

// Loads chunks [kc0, kc0 + kPiece) ∩ [0, KC) of the warp's m16 tile into buf (kEarly: before the PDL wait).
template <bool kEarly = false>
__device__ __forceinline__ void load_piece(ChunkRegs (&buf)[kPiece], const uint8_t* wp, int kc0, int KC, int lane) {
#pragma unroll
  for (int i = 0; i < kPiece; ++i)
    if (kc0 + i < KC) {
      if constexpr (kEarly) load_chunk_early(buf[i], wp + static_cast<size_t>(kc0 + i) * kChunkBytes, lane);
      else load_chunk(buf[i], wp + static_cast<size_t>(kc0 + i) * kChunkBytes, lane);
    }
}

// acc += the chunks [kc0, kc0 + kPiece) ∩ [0, KC): the mma.sp kernel's k-steps in its order. xs: the
// lane's token row in shared memory (+ 8·t), xv: whether that token exists (else B = 0).
__device__ __forceinline__ void mma_piece(float acc[4], const ChunkRegs (&buf)[kPiece], const uint16_t* xs, bool xv,
                                          int kc0, int KC) {
#pragma unroll
  for (int i = 0; i < kPiece; ++i) {
    if (kc0 + i >= KC) break;
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const uint4 b =
          xv ? *reinterpret_cast<const uint4*>(xs + (kc0 + i) * kChunkK + s * 32) : make_uint4(0, 0, 0, 0);
      const uint32_t sw = u4get(buf[i].scales, s >> 1) >> (16 * (s & 1));
      uint32_t af[4];
      unpack_a_fragment(u4get(buf[i].codes[s >> 2], s & 3), ue4m3x2_to_bf16x2_x2p119(sw), af);
      mma_sp(acc, af, b, meta_of_step(u4get(buf[i].meta, s >> 1), s & 1));
    }
  }
}

// fuse: make the rows with sw's SwiGLU (+ requant) instead of reading a.x / a.x_inv_scale.
// kChunked: capacity may exceed kRoutesMaxTokens (the chunk loop); else it runs once (capacity ≤ 8),
// so the decode instance keeps its 3 CTAs per SM without spills.
template <bool kChunked>
__global__ void __launch_bounds__(kWarps * 32, kChunked ? 2 : 3)
    grouped_sparse_gemm_routes_kernel(SparseGemmArgs a, int m_blocks, SwigluQuantArgs sw, bool fuse, size_t rows_off) {
  extern __shared__ __align__(16) unsigned char s_dyn[];
  uint16_t* s_x = reinterpret_cast<uint16_t*>(s_dyn);  // [count, K_pad + kRowPad] bf16: the expert's token rows
  unsigned char* s_scratch = s_dyn + rows_off;         // fuse: [I] fp32, the SwiGLU row function's
  __shared__ uint32_t s_hit[kWords];                   // bit e: a route hits this call's expert e
  __shared__ int s_rank[kWords + 1];                   // hit experts in the words before
  __shared__ float s_inv[kRoutesMaxTokens];            // fuse: each row's 1/γ_a
  __shared__ float s_red[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int E = a.num_experts, words = (E + 31) / 32;
  const int MT = static_cast<int>(a.M_pad / 16), KC = static_cast<int>(a.K_pad / kChunkK);

  // 1. The hit experts, from the routes: complete (written ≥ 2 kernels back, pdl.cuh), read past L1.
  for (int i = threadIdx.x; i < words; i += blockDim.x) s_hit[i] = 0;
  __syncthreads();
  for (int64_t r = threadIdx.x; r < a.num_routes; r += blockDim.x) {
    const int e = __ldcg(a.route_experts + r) - a.expert_begin;
    if (e >= 0 && e < E) atomicOr(&s_hit[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
  if (warp == 0) {  // inclusive scan of the words' popcounts
    int v = lane < words ? __popc(s_hit[lane]) : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += n;
    }
    s_rank[lane + 1] = v;
    if (lane == 0) s_rank[0] = 0;
  }
  __syncthreads();
  const int j = blockIdx.x / m_blocks, mb = blockIdx.x % m_blocks;
  if (j >= s_rank[words]) return;  // fewer hit experts than the grid's bound: the whole CTA leaves
  int w = 0;
  while (s_rank[w + 1] <= j) ++w;
  uint32_t bits = s_hit[w];
  for (int k = j - s_rank[w]; k > 0; --k) bits &= bits - 1;  // drop the lower hit experts of the word
  const int e = w * 32 + __ffs(bits) - 1;

  // 2. Before the wait: the warp's first two weight pieces and the weight γ (no kernel writes them).
  const int mt = mb * kWarps + warp;
  const bool has_rows = mt < MT;  // the last m-block may be partial: such a warp only helps stage x
  const uint8_t* wp = a.w + (static_cast<size_t>(e) * MT + min(mt, MT - 1)) * KC * kChunkBytes;
  ChunkRegs buf0[kPiece], buf1[kPiece];
  if (has_rows) {
    load_piece<true>(buf0, wp, 0, KC, lane);
    load_piece<true>(buf1, wp, kPiece, KC, lane);
  }
  const float inv_w = a.w_inv_gamma[e];
  const float inv_w_hi = a.w_inv_gamma_hi ? a.w_inv_gamma_hi[e] : inv_w;
  pdl_enter();

  // 3–5 per chunk of ≤ 8 of the expert's rows (one chunk up to kRoutesMaxTokens rows; more, with
  // SparseGemmArgs::routes_max_tokens, re-stream the weights per chunk): the rows into shared memory (copied,
  // or made by the SwiGLU row function) with their 1/γ_a, the K loop, the epilogue.
  const int count = min(max(a.counts[e], 0), a.capacity);
  const int64_t ld = a.K_pad + kRowPad, vecs = a.K_pad / 8;
  const int eg = e + a.expert_begin;  // sw indexes the layer's experts
#pragma unroll 1
  for (int c0 = 0; c0 < (kChunked ? count : min(count, 1)); c0 += kRoutesMaxTokens) {
    const int n = min(kRoutesMaxTokens, count - c0);
    if (c0 > 0) __syncthreads();  // every warp is done with the last chunk's rows
    if (fuse) {
      for (int r = 0; r < n; ++r) {
        swiglu_quant_row(sw, eg, static_cast<int64_t>(eg) * sw.capacity + c0 + r, s_scratch, s_red, s_x + r * ld,
                         &s_inv[r]);
        __syncthreads();  // the scratch is the next row's
      }
    } else {
      const uint16_t* x_e = a.x + (static_cast<size_t>(e) * a.capacity + c0) * a.K_pad;
      for (int64_t i = threadIdx.x; i < n * vecs; i += blockDim.x) {
        const int64_t r = i / vecs, c = (i % vecs) * 8;
        *reinterpret_cast<uint4*>(s_x + r * ld + c) = *reinterpret_cast<const uint4*>(x_e + r * a.K_pad + c);
      }
    }
    __syncthreads();
    if (!has_rows) continue;  // this warp only helps stage the rows
    float inv_a[2];
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int tok = 2 * t + jj;
      inv_a[jj] = 1.0f;
      if (a.x_inv_scale && tok < n)
        inv_a[jj] = fuse ? s_inv[tok] : a.x_inv_scale[static_cast<size_t>(e) * a.capacity + c0 + tok];
    }

    // 4. The K loop: compute one piece while the other loads.
    const bool xv = g < n;
    const uint16_t* xs = s_x + (xv ? g : 0) * ld + 8 * t;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
    for (int kc0 = 0; kc0 < KC; kc0 += 2 * kPiece) {
      mma_piece(acc, buf0, xs, xv, kc0, KC);
      if (kc0 + 2 * kPiece < KC) load_piece(buf0, wp, kc0 + 2 * kPiece, KC, lane);
      if (kc0 + kPiece < KC) {
        mma_piece(acc, buf1, xs, xv, kc0 + kPiece, KC);
        if (kc0 + 3 * kPiece < KC) load_piece(buf1, wp, kc0 + 3 * kPiece, KC, lane);
      }
    }
    if (c0 + kRoutesMaxTokens < count) {  // the next chunk's first two pieces, in flight while it stages
      load_piece(buf0, wp, 0, KC, lane);
      load_piece(buf1, wp, kPiece, KC, lane);
    }

    // 5. Epilogue: α = (1/γ_w)·(1/γ_a) in that order (sparse_gemm_ref), bf16 and/or fp32.
    const float gamma_w = (static_cast<int64_t>(mt) * 16 >= a.m_split && a.w_inv_gamma_hi) ? inv_w_hi : inv_w;
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const int tok = 2 * t + jj;
      if (tok >= n) continue;
      const size_t slot = static_cast<size_t>(e) * a.capacity + c0 + tok;
      const float alpha = gamma_w * inv_a[jj];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = static_cast<int64_t>(mt) * 16 + g + 8 * h;
        if (m >= a.M) continue;
        const float v = (acc[2 * h + jj] * kAccUnscale) * alpha;
        const size_t idx = slot * a.ldy + m;
        if (a.y) a.y[idx] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
        if (a.y_f32) a.y_f32[idx] = v;
      }
    }
  }
}

}  // namespace

bool sparse_gemm_routes_fits(const SparseGemmArgs& a) {
  return a.route_experts && a.num_routes > 0 && a.capacity > 0 &&
         a.capacity <= std::min(a.routes_max_tokens, kRoutesMaxChunkedTokens) &&
         a.num_experts <= kMaxExperts && a.x_layout == format::ActLayout::kMmaFragment && smem_bytes(a) <= kMaxSmem;
}

void launch_sparse_gemm_routes(const SparseGemmArgs& a, cudaStream_t stream) {
  static const bool configured = [] {  // once: not a stream operation, so capture-safe
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(grouped_sparse_gemm_routes_kernel<false>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(grouped_sparse_gemm_routes_kernel<true>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem));
    return true;
  }();
  (void)configured;
  const int MT = static_cast<int>(a.M_pad / 16);
  const int m_blocks = (MT + kWarps - 1) / kWarps;
  const int64_t hit_bound = std::min<int64_t>(a.num_routes, a.num_experts);  // experts the routes can hit
  const int64_t grid = hit_bound * m_blocks;
  MOESQ_CHECK(grid <= 0x7fffffff, "sparse_gemm: routes grid of ", grid, " CTAs");
  SwigluQuantArgs sw;
  if (a.fused_swiglu) {
    sw = *a.fused_swiglu;
    swiglu_quant_check(sw);
    MOESQ_CHECK(sw.I_pad == a.K_pad && sw.capacity == a.capacity && sw.layout == format::ActLayout::kMmaFragment &&
                    a.expert_begin + a.num_experts <= sw.num_experts,
                "sparse_gemm: fused SwiGLU of I_pad ", sw.I_pad, ", capacity ", sw.capacity, " over ", sw.num_experts,
                " experts for a GEMM of K_pad ", a.K_pad, ", capacity ", a.capacity, ", experts [", a.expert_begin,
                ", ", a.expert_begin + a.num_experts, ") (the kMmaFragment layout required)");
  }
  auto* kernel = a.capacity > kRoutesMaxTokens ? grouped_sparse_gemm_routes_kernel<true>
                                               : grouped_sparse_gemm_routes_kernel<false>;
  launch_pdl("grouped_sparse_gemm_routes_kernel", kernel, dim3(static_cast<unsigned>(grid)), dim3(kWarps * 32),
             smem_bytes(a), stream, a, m_blocks, sw, a.fused_swiglu != nullptr, rows_bytes(a));
}

}  // namespace moesq::ops::detail
