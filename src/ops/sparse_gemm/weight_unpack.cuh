// Weight unpacking shared by the two grouped sparse GEMM kernels (sparse_gemm_mma.cu: mma.sp m16n8k32;
// sparse_gemm_wgmma.cu: wgmma.mma_async.sp m64nNk32): one warp's view of a kernel-layout chunk
// (16 weight rows × 256 logical K, format/kernel_layout.h, docs/KERNEL_LAYOUT.md §2) and its unpacking
// to the EXACT bf16 A fragment of one 32-wide k-step. Both instructions take the same per-warp A
// fragment and metadata register (a warpgroup's warp w owns rows 16w..16w+15 of the m64 tile).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "format/kernel_layout.h"

namespace moesq::ops::detail {

constexpr int kChunkBytes = 1408;  // format::kChunkBytes: one 16-row × 256-K chunk
constexpr int kChunkK = 256;
constexpr int kSteps = 8;          // mma k-steps (32 K each) per chunk
constexpr int kScaleOff = 1024;    // format::kChunkCodeBytes
constexpr int kMetaOff = 1152;     // + format::kChunkScaleBytes
static_assert(kChunkBytes == format::kChunkBytes && kChunkK == format::kChunkK && kSteps == format::kKStepsPerChunk,
              "weight_unpack.cuh: chunk size and k-steps must match format/kernel_layout.h");
static_assert(kScaleOff == format::kChunkCodeBytes && kMetaOff == format::kChunkCodeBytes + format::kChunkScaleBytes,
              "weight_unpack.cuh: scale and metadata offsets inside a chunk must match format/kernel_layout.h");
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

// ld_stream as a volatile asm: the compiler keeps it before a later volatile asm (the routes kernel's
// weight loads issued before griddepcontrol.wait, core/cuda/pdl.cuh), where a plain asm could sink to its use.
__device__ __forceinline__ uint4 ld_stream_early(const uint8_t* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
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
// zero-scale block (format/kernel_layout.cpp), and 0 · 2^104 = 0.
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
// sign at 15, +16 for the high half; format/kernel_layout.cpp code_bit_pos): 9 integer ops for 8 codes.
__device__ __forceinline__ void unpack_a_fragment(uint32_t w, uint32_t s2, uint32_t a[4]) {
  constexpr uint32_t kMag = 0x01C001C0u, kSign = 0x80008000u;
  const uint32_t s_g = __byte_perm(s2, 0, 0x1010), s_g8 = __byte_perm(s2, 0, 0x3232);
  a[0] = bf16x2_mul_exact(w & (kMag | kSign), s_g);
  a[1] = bf16x2_mul_exact((w << 3) & (kMag | kSign), s_g8);
  a[2] = bf16x2_mul_exact(((w >> 3) & kMag) | ((w << 1) & kSign), s_g);
  a[3] = bf16x2_mul_exact(((w << 6) & kMag) | ((w << 2) & kSign), s_g8);
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

// load_chunk issued where written (ld_stream_early), for loads that must precede a PDL wait.
__device__ __forceinline__ void load_chunk_early(ChunkRegs& r, const uint8_t* chunk, int lane) {
  const int g = lane >> 2, t = lane & 3;
  r.codes[0] = ld_stream_early(chunk + lane * 16);
  r.codes[1] = ld_stream_early(chunk + 512 + lane * 16);
  r.scales = ld_stream_early(chunk + kScaleOff + g * 16);
  r.meta = ld_stream_early(chunk + kMetaOff + (g * 2 + (t & 1)) * 16);
}

// D += A·B, A 16×32 2:4-sparse bf16 (4 regs + metadata, selector 0), B 32×8 bf16, D fp32 (the mma.sp
// kernels: sparse_gemm_mma.cu, sparse_gemm_routes.cu).
__device__ __forceinline__ void mma_sp(float c[4], const uint32_t a[4], const uint4& b, uint32_t meta) {
  asm("mma.sp::ordered_metadata.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9,%10,%11}, {%0,%1,%2,%3}, %12, 0x0;"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y), "r"(b.z), "r"(b.w), "r"(meta));
}

// Pulls one chunk into L2 ahead of its register load (no register cost): the register double
// buffer alone leaves only one chunk per m-tile in flight, too few bytes to cover HBM latency.
__device__ __forceinline__ void prefetch_l2(const uint8_t* p) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(kChunkBytes) : "memory");
}
}  // namespace moesq::ops::detail
