// Batch-invariant grouped bf16 GEMM (gemm_bf16.h). A CTA of 4 warps owns a 64×64 output tile of one
// group; K advances in 64-wide tiles staged in shared memory (zero-filled past M, N and the group's
// count); each warp holds 2×2 wmma m16n16k16 fp32 accumulators. Optional split-K with slices fixed by K
// alone (split_ws; gemm_bf16_split_reduce adds them in slice order). Without it: the reduction order of
// an element is fixed by K alone (see the header).
#include "ops/gemm_bf16/gemm_bf16.h"

#include <cuda_bf16.h>
#include <mma.h>

#include "core/cuda/check.cuh"
#include "core/cuda/pdl.cuh"
#include "ops/gemm_bf16/gemm_bf16_decode.h"
#include "ops/gemm_bf16/gemm_bf16_large_m.h"
#include "ops/gemm_bf16/gemm_bf16_small_m.h"
#include "ops/gemm_bf16/gemm_bf16_wa.h"

namespace moesq::ops {

namespace {

constexpr int kThreads = 128;
constexpr int kPad = 8;  // bf16 elements of row padding (16 B) against bank conflicts
constexpr int kLds = kGemmBlockK + kPad;
constexpr int kVecPerThread = kGemmBlockM * kGemmBlockK / 8 / kThreads;  // 16-byte loads per operand
static_assert(kGemmBlockM == kGemmBlockN && kVecPerThread * kThreads * 8 == kGemmBlockM * kGemmBlockK,
              "the tile loader assumes square M/N tiles split evenly over the threads");

// K range [k_begin, k_end) (the whole K without split). part != nullptr: raw fp32 tile sums to
// part [M, N] (split slice), no epilogue.
__global__ void __launch_bounds__(kThreads) gemm_bf16_kernel(GemmBf16Args a, int64_t k_begin, int64_t k_end, float* part) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  using namespace nvcuda;
  __shared__ __align__(128) uint16_t s_x[kGemmBlockM * kLds];  // [BLOCK_M, BLOCK_K + pad]
  __shared__ __align__(128) uint16_t s_w[kGemmBlockN * kLds];  // [BLOCK_N, BLOCK_K + pad]
  __shared__ __align__(128) uint16_t s_xl[kGemmBlockM * kLds]; // [BLOCK_M, BLOCK_K + pad] x_lo tile
  __shared__ __align__(128) float s_y[kGemmBlockM * kGemmBlockN];  // [BLOCK_M, BLOCK_N] epilogue stage
  const int g = part ? 0 : blockIdx.z;
  if (part) {  // split slice blockIdx.z: K range [z·kGemmSplitK, min(K, (z + 1)·kGemmSplitK))
    part += static_cast<int64_t>(blockIdx.z) * a.M * a.N;
    k_begin = static_cast<int64_t>(blockIdx.z) * kGemmSplitK;
    k_end = min(a.K, k_begin + kGemmSplitK);
  }
  const int64_t rows = a.counts ? min(max(a.counts[g], 0), static_cast<int>(a.M)) : a.M;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kGemmBlockM, n0 = static_cast<int64_t>(blockIdx.x) * kGemmBlockN;
  if (m0 >= rows) return;
  const uint16_t* x = a.x + static_cast<int64_t>(g) * a.M * a.K;
  const uint16_t* w = a.w + static_cast<int64_t>(g) * a.N * a.K;
  const uint16_t* xl = a.x_lo ? a.x_lo + static_cast<int64_t>(g) * a.M * a.K : nullptr;
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kGemmBlockK) {
    // All global loads of the tile first (kVecPerThread × 3 in flight), then the shared stores.
    uint4 xv[kVecPerThread], wv[kVecPerThread], lv[kVecPerThread];
#pragma unroll
    for (int i = 0; i < kVecPerThread; ++i) {
      const int v = threadIdx.x + i * kThreads;
      const int r = v / (kGemmBlockK / 8), c = (v % (kGemmBlockK / 8)) * 8;
      const bool kin = k0 + c < k_end;
      xv[i] = wv[i] = lv[i] = make_uint4(0, 0, 0, 0);
      if (m0 + r < rows && kin) xv[i] = *reinterpret_cast<const uint4*>(x + (m0 + r) * a.K + k0 + c);
      if (n0 + r < a.N && kin) wv[i] = *reinterpret_cast<const uint4*>(w + (n0 + r) * a.K + k0 + c);
      if (xl && m0 + r < rows && kin) lv[i] = *reinterpret_cast<const uint4*>(xl + (m0 + r) * a.K + k0 + c);
    }
#pragma unroll
    for (int i = 0; i < kVecPerThread; ++i) {
      const int v = threadIdx.x + i * kThreads;
      const int r = v / (kGemmBlockK / 8), c = (v % (kGemmBlockK / 8)) * 8;
      *reinterpret_cast<uint4*>(s_x + r * kLds + c) = xv[i];
      *reinterpret_cast<uint4*>(s_w + r * kLds + c) = wv[i];
      if (xl) *reinterpret_cast<uint4*>(s_xl + r * kLds + c) = lv[i];
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kGemmBlockK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
      for (int i = 0; i < 2; ++i)
        wmma::load_matrix_sync(fa[i], reinterpret_cast<const __nv_bfloat16*>(s_x + (wm * 32 + i * 16) * kLds + kk), kLds);
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(fb[j], reinterpret_cast<const __nv_bfloat16*>(s_w + (wn * 32 + j * 16) * kLds + kk), kLds);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      if (xl) {
        for (int i = 0; i < 2; ++i)
          wmma::load_matrix_sync(fa[i], reinterpret_cast<const __nv_bfloat16*>(s_xl + (wm * 32 + i * 16) * kLds + kk), kLds);
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(s_y + (wm * 32 + i * 16) * kGemmBlockN + wn * 32 + j * 16, acc[i][j], kGemmBlockN,
                              wmma::mem_row_major);
  __syncthreads();
  for (int v = threadIdx.x; v < kGemmBlockM * kGemmBlockN; v += kThreads) {
    const int r = v / kGemmBlockN, c = v % kGemmBlockN;
    if (m0 + r >= rows || n0 + c >= a.N) continue;
    const int64_t o = (static_cast<int64_t>(g) * a.M + m0 + r) * a.ldy + n0 + c;
    const float val = s_y[v];
    if (part)
      part[(m0 + r) * a.N + n0 + c] = val;
    else if (a.y_f32)
      a.y_f32[o] = a.accumulate ? __fadd_rn(a.y_f32[o], val) : val;
    else
      a.y_bf16[o] = __bfloat16_as_ushort(__float2bfloat16_rn(val));
  }
}

// y[m, n] = (accumulate ? y : 0) + Σ_s part[s, m, n], s ascending (fixed order).
__global__ void gemm_bf16_split_reduce(GemmBf16Args a, const float* part, int slices) {
  pdl_enter();  // core/cuda/pdl.cuh: nothing of an earlier kernel is touched before it
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.M * a.N) return;
  const int64_t m = i / a.N, n = i % a.N;
  float acc = part[i];
  for (int s = 1; s < slices; ++s) acc = __fadd_rn(acc, part[s * a.M * a.N + i]);
  float* y = a.y_f32 + m * a.ldy + n;
  *y = a.accumulate ? __fadd_rn(*y, acc) : acc;
}

}  // namespace

bool gemm_bf16_fuses_topk(const GemmBf16Args& a) {
  return a.fused_topk && a.groups == 1 && !a.counts && a.y_f32 && !a.accumulate && a.fused_topk->logits == a.y_f32 &&
         a.fused_topk->T == a.M && a.fused_topk->num_experts == a.N && a.ldy == a.N && a.M > 0 &&
         detail::gemm_bf16_small_m_fits(a);
}

void gemm_bf16(const GemmBf16Args& a, cudaStream_t stream) {
  gemm_bf16_check(a);
  MOESQ_CHECK(!a.fused_topk || gemm_bf16_fuses_topk(a) || a.M == 0, "gemm_bf16: fused_topk at M=", a.M,
              " (the small-M path, M <= ", detail::kGemmSmallM, ", runs it)");
  if (a.M == 0) return;
  // M ≤ 8 with MOESQ_SMALL_M_WA=1: W as the MMA's A operand (opt-in until measured; gemm_bf16_wa.h).
  if (!a.fused_topk && detail::gemm_bf16_wa_enabled(a)) return detail::gemm_bf16_wa(a, stream);
  // M ≤ 64: the decode path (W read once for all tokens; gemm_bf16_decode.h) from M = gemm_bf16_decode_min_m(),
  // else the small-M kernel; same bits.
  if (detail::gemm_bf16_decode_enabled(a)) return detail::gemm_bf16_decode(a, stream);  // never with fused_topk
  if (detail::gemm_bf16_small_m_fits(a)) return detail::gemm_bf16_small_m(a, stream);
  // 128×128 tiles where they are faster (gemm_bf16_large_m_fits; same bits per row), else 64×64 tiles.
  if (detail::gemm_bf16_large_m_fits(a)) return detail::gemm_bf16_large_m(a, stream);
  detail::gemm_bf16_tile(a, stream);
}

namespace detail {

void gemm_bf16_tile(const GemmBf16Args& a, cudaStream_t stream) {
  if (a.M == 0) return;
  const dim3 grid(static_cast<unsigned>((a.N + kGemmBlockN - 1) / kGemmBlockN),
                  static_cast<unsigned>((a.M + kGemmBlockM - 1) / kGemmBlockM), static_cast<unsigned>(a.groups));
  MOESQ_CHECK(grid.y <= 65535 && grid.z <= 65535, "gemm_bf16: M=", a.M, " or G=", a.groups, " too large for the grid");
  if (a.split_ws) {
    static_assert(kGemmSplitK % kGemmBlockK == 0, "split slices must hold whole K tiles");
    const int slices = static_cast<int>((a.K + kGemmSplitK - 1) / kGemmSplitK);
    MOESQ_CHECK(slices <= 65535, "gemm_bf16: K=", a.K, " too many split slices");
    const dim3 sgrid(grid.x, grid.y, static_cast<unsigned>(slices));  // blockIdx.z = slice
    launch_pdl("gemm_bf16_kernel", gemm_bf16_kernel, dim3(sgrid), dim3(kThreads), 0, stream, a, 0, 0, a.split_ws);
    const int64_t n = a.M * a.N;
    launch_pdl("gemm_bf16_split_reduce", gemm_bf16_split_reduce, dim3(static_cast<unsigned>((n + 255) / 256)),
               dim3(256), 0, stream, a, a.split_ws, slices);
    return;
  }
  launch_pdl("gemm_bf16_kernel", gemm_bf16_kernel, dim3(grid), dim3(kThreads), 0, stream, a, 0, a.K, nullptr);
}

}  // namespace detail

}  // namespace moesq::ops
