// Packed-AWQ MoE GEMM kernel + launcher (see awq_gemm.h).
// One CUDA block = thread_n threads (thread_n/32 warps); it walks work items item = blockIdx.x,
// blockIdx.x + G, …: items [0, direct_tiles) are full-K tiles, the rest are (remainder tile, slice)
// pairs — exactly TileSchedule's decomposition. Per K-tile: the [thread_n, thread_k] weight slab is
// dequantized ((q − z)·s, one fp16 rounding) into shared memory, the 8 routed activation rows are
// staged next to it, each warp runs mma.sync m16n8k16 with W as the A operand (16 output columns) and
// the 8 routes as the B operand (n = 8 = b), a fresh fp32 K-tile partial is added to the slice
// accumulator (the `_ref` order). Split slices write fp32 partials; a second kernel reduces them in
// slice order 0..s−1 and rounds once to fp16.
// Non-obvious: routes sit on the mma N dimension, so a route's column of D never mixes with another
// route's — reordering routes inside a block cannot change any bit, only the tile's schedule can.
#include "ops/awq_gemm/awq_gemm.h"

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "core/cuda/check.cuh"
#include "format/awq_int4.h"

namespace moesq::ops {

namespace {

constexpr int kRows = 8;       // MoE block rows = mma n8
constexpr int kPad = 8;        // smem row padding (halves) against bank conflicts
constexpr int kAwqGroupK = 128;
static_assert(kAwqGroupK == format::kAwqGroup, "the kernel assumes AWQ group 128");

// Column of nibble i in an AWQ word, as arithmetic (host constexpr arrays are not visible in device code).
__host__ __device__ constexpr int awq_order(int i) { return (i % 4) * 2 + i / 4; }
static_assert(awq_order(0) == format::kAwqOrder[0] && awq_order(1) == format::kAwqOrder[1] &&
                  awq_order(4) == format::kAwqOrder[4] && awq_order(7) == format::kAwqOrder[7],
              "awq_order must equal AutoAWQ's order [0,2,4,6,1,3,5,7]");

// mma.sync m16n8k16 row.col f32 += f16·f16: the Ampere+/Hopper warp-level tensor-core instruction.
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

struct Params {
  AwqMoeGemmCudaDesc d;
  int64_t N, K;
  int TK, TN, n_tiles, k_tiles, slices;
  int64_t direct_tiles, split_tiles, grid;
};

__global__ void awq_moe_gemm_kernel(Params p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int TK = p.TK, TN = p.TN, ldw = TK + kPad;
  __half* Ws = reinterpret_cast<__half*>(smem_raw);  // [TN][TK + pad]: ŵ[n][k]
  __half* Xs = Ws + TN * ldw;                         // [8][TK + pad]: routed activations
  __shared__ int32_t routes[kRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
  const int64_t words_n = p.N / 8;
  const int64_t total_items = p.direct_tiles + p.split_tiles * p.slices;

  for (int64_t item = blockIdx.x; item < total_items; item += p.grid) {
    int64_t t, rem = -1;
    int slice = 0, nsl = 1;
    if (item < p.direct_tiles) {
      t = item;
    } else {
      rem = (item - p.direct_tiles) / p.slices;
      slice = static_cast<int>((item - p.direct_tiles) % p.slices);
      t = p.direct_tiles + rem;
      nsl = p.slices;
    }
    const int64_t blk = t / p.n_tiles, n0 = (t % p.n_tiles) * TN;
    const int expert = p.d.block_expert[blk];
    const int slot = p.d.expert_slot[expert];
    if (threadIdx.x < kRows) routes[threadIdx.x] = p.d.sorted_ids[blk * kRows + threadIdx.x];
    __syncthreads();
    const int32_t* qw = p.d.qweight + static_cast<int64_t>(slot) * p.K * words_n;
    const int32_t* qz = p.d.qzeros + static_cast<int64_t>(slot) * (p.K / kAwqGroupK) * words_n;
    const __half* sc = p.d.scales + static_cast<int64_t>(slot) * (p.K / kAwqGroupK) * p.N;

    float acc[2][4] = {};  // 2 m16 tiles per warp (32 output columns), D[n][route]
    const int kt_per = p.k_tiles / nsl;
    for (int kt = slice * kt_per; kt < (slice + 1) * kt_per; ++kt) {
      const int64_t k0 = static_cast<int64_t>(kt) * TK, grp = k0 / kAwqGroupK;
      // Dequantize the slab: TK rows × TN/8 words, each word = 8 columns of one k.
      for (int idx = threadIdx.x; idx < TK * (TN / 8); idx += blockDim.x) {
        const int kk = idx / (TN / 8), wn = idx % (TN / 8);
        const uint32_t w = static_cast<uint32_t>(qw[(k0 + kk) * words_n + n0 / 8 + wn]);
        const uint32_t z = static_cast<uint32_t>(qz[grp * words_n + n0 / 8 + wn]);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int col = wn * 8 + awq_order(i);
          const int q = (w >> (4 * i)) & 0xf, zz = (z >> (4 * i)) & 0xf;
          Ws[col * ldw + kk] = __hmul(__int2half_rn(q - zz), sc[grp * p.N + n0 + col]);
        }
      }
      for (int idx = threadIdx.x; idx < kRows * TK; idx += blockDim.x) {
        const int r = idx / TK, kk = idx % TK;
        const int32_t route = routes[r];
        Xs[r * ldw + kk] = route == p.d.sentinel ? __float2half(0.0f)
                                                 : p.d.A[static_cast<int64_t>(route / p.d.a_row_div) * p.K + k0 + kk];
      }
      __syncthreads();
      float part[2][4] = {};  // the K-tile partial sum (fresh per K-tile, as in the `_ref`)
      for (int kk = 0; kk < TK; kk += 16) {
        uint32_t b[2];
        b[0] = *reinterpret_cast<const uint32_t*>(&Xs[g * ldw + kk + 2 * tig]);
        b[1] = *reinterpret_cast<const uint32_t*>(&Xs[g * ldw + kk + 2 * tig + 8]);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          const int nr = warp * 32 + mt * 16 + g;
          uint32_t a[4];
          a[0] = *reinterpret_cast<const uint32_t*>(&Ws[nr * ldw + kk + 2 * tig]);
          a[1] = *reinterpret_cast<const uint32_t*>(&Ws[(nr + 8) * ldw + kk + 2 * tig]);
          a[2] = *reinterpret_cast<const uint32_t*>(&Ws[nr * ldw + kk + 2 * tig + 8]);
          a[3] = *reinterpret_cast<const uint32_t*>(&Ws[(nr + 8) * ldw + kk + 2 * tig + 8]);
          mma_16816(part[mt], a, b);
        }
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][i] += part[mt][i];
      __syncthreads();
    }
    // Epilogue: D element i of tile mt is (n = warp·32 + mt·16 + g + 8·(i ≥ 2), route row 2·tig + (i & 1)).
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int nl = warp * 32 + mt * 16 + g + (i >= 2 ? 8 : 0), r = 2 * tig + (i & 1);
        const int32_t route = routes[r];
        if (rem < 0 || nsl == 1) {
          if (route != p.d.sentinel) p.d.C[static_cast<int64_t>(route) * p.N + n0 + nl] = __float2half_rn(acc[mt][i]);
        } else {
          p.d.workspace[((rem * nsl + slice) * kRows + r) * TN + nl] = acc[mt][i];
        }
      }
    __syncthreads();  // `routes` is rewritten by the next item
  }
}

// Fixed-order fp32 reduction of the split remainder: out = s_0; out += s_1; … ; one fp16 rounding.
__global__ void awq_slice_reduce_kernel(Params p) {
  const int64_t total = p.split_tiles * kRows * p.TN;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t rem = idx / (kRows * p.TN);
    const int r = static_cast<int>((idx / p.TN) % kRows), nl = static_cast<int>(idx % p.TN);
    const int64_t t = p.direct_tiles + rem, blk = t / p.n_tiles, n0 = (t % p.n_tiles) * p.TN;
    const int32_t route = p.d.sorted_ids[blk * kRows + r];
    if (route == p.d.sentinel) continue;
    float v = p.d.workspace[((rem * p.slices + 0) * kRows + r) * p.TN + nl];
    for (int s = 1; s < p.slices; ++s) v += p.d.workspace[((rem * p.slices + s) * kRows + r) * p.TN + nl];
    p.d.C[static_cast<int64_t>(route) * p.N + n0 + nl] = __float2half_rn(v);
  }
}

size_t smem_bytes(int TN, int TK) { return static_cast<size_t>(TN + kRows) * (TK + kPad) * sizeof(__half); }

}  // namespace

int64_t awq_workspace_floats(const ops::TileSchedule& s) {
  return s.slices > 1 ? s.split_tiles * s.slices * kRows * s.thread_n : 0;
}

bool awq_gemm_cuda_supported(const ops::TileSchedule& s, int block_size) {
  return block_size == kRows && (s.thread_n == 64 || s.thread_n == 128) && s.thread_k % 16 == 0 &&
         s.thread_k <= kAwqGroupK && kAwqGroupK % s.thread_k == 0 && s.N % s.thread_n == 0 && s.K % kAwqGroupK == 0;
}

int awq_gemm_blocks_per_sm(int thread_n, int thread_k) {
  int n = 0;
  MOESQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, awq_moe_gemm_kernel, thread_n,
                                                                 smem_bytes(thread_n, thread_k)));
  return n;
}

void awq_moe_gemm_cuda(const AwqMoeGemmCudaDesc& d, cudaStream_t stream) {
  const ops::TileSchedule& s = d.sched;
  MOESQ_CHECK(awq_gemm_cuda_supported(s, d.block_size), "awq_moe_gemm_cuda: unsupported config N=", s.N, " K=", s.K,
              " thread_k=", s.thread_k, " thread_n=", s.thread_n, " b=", d.block_size,
              " (needs b=8, thread_n 64|128, thread_k | 128): use ops::awq_moe_gemm_ref");
  MOESQ_CHECK(s.slices == 1 || d.workspace, "awq_moe_gemm_cuda: split schedule needs a workspace of ",
              awq_workspace_floats(s), " floats");
  if (s.tiles == 0) return;
  Params p{d, s.N, s.K, s.thread_k, s.thread_n, static_cast<int>(s.n_tiles), static_cast<int>(s.k_tiles), s.slices,
           s.direct_tiles, s.split_tiles, s.grid};
  const size_t smem = smem_bytes(s.thread_n, s.thread_k);
  awq_moe_gemm_kernel<<<static_cast<unsigned>(s.grid), s.thread_n, smem, stream>>>(p);
  MOESQ_CUDA_LAUNCH_CHECK("awq_moe_gemm_kernel");
  if (s.slices > 1) {
    const int64_t total = s.split_tiles * kRows * s.thread_n;
    awq_slice_reduce_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(p);
    MOESQ_CUDA_LAUNCH_CHECK("awq_slice_reduce_kernel");
  }
}

}  // namespace moesq::ops
