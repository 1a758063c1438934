// Load-time transform of paired 4:8 NVFP4 experts (format/nvfp4.h) into the layout the Hopper
// grouped sparse GEMM streams (src/ops/sparse_gemm/), plus the activation K order it expects.
// docs/KERNEL_LAYOUT.md draws both layouts.
//
// Non-obvious decision: the kernel layout keeps the PACKED bits (E2M1 codes, UE4M3 scales, one
// ordered-metadata nibble per group of 8) — 2.75 bits/weight, the same bytes as the checkpoint —
// and only reorders them (down to single bits: sign and magnitude bits of each E2M1 code sit where a
// shift and a mask turn them into bf16x2 bits), so that each lane of a warp fetches its mma.sp
// fragment for 8 k-steps with four 16-byte loads and unpacks it to exact bf16 in registers
// (DESIGN.md §4). The one value-preserving change: codes of zero-scale blocks are stored as 0. Decoding to
// bf16 at load time would be simpler but would move 5.8× more bytes in the memory-bound (small-N) regime.
//
// Two fixed permutations of K are involved:
//  1. paired 4:8 → 2:4: inside every group of 8, positions [0,2,4,6,1,3,5,7] (DESIGN.md §4), applied
//     to weights AND activations;
//  2. storage order of a 32-wide k-step in the activation rows: lane t of an mma quad reads the 8
//     B-fragment elements it needs as one contiguous 16-byte vector. Only the mma.sp kernel's
//     activation layout (ActLayout::kMmaFragment) applies it; the wgmma.sp kernel's K-major layout
//     (ActLayout::kKMajor) stops after step 1.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/nvfp4.h"

namespace moesq::format {

constexpr int kMmaM = 16;                  // rows of one mma.sp m16n8k32 A tile
constexpr int kMmaK = 32;                  // logical K of one mma.sp step
constexpr int kKStepsPerChunk = 8;         // mma k-steps per streamed chunk
constexpr int kChunkK = kMmaK * kKStepsPerChunk;  // 256 logical K per chunk
constexpr int kChunkCodeBytes = 1024;      // [2 vec][32 lanes][16 B]: 8 steps × 32 lanes × 8 E2M1
constexpr int kChunkScaleBytes = 128;      // [8 quads][8 steps][2 rows] UE4M3
constexpr int kChunkMetaBytes = 256;       // [8 quads][2 lanes][4 step pairs][4 B] ordered-metadata nibbles
constexpr int kChunkBytes = kChunkCodeBytes + kChunkScaleBytes + kChunkMetaBytes;  // 1408
static_assert(kChunkBytes * 8 == kMmaM * kChunkK * 11 / 4, "a chunk must hold exactly 2.75 bits/weight");

// Which 32 bits of mma.sp m16n8k32 (16-bit types, sparsity selector 0) lanes t = 0, 1 of quad g
// hold. kHalfK: lane t covers logical K [16t, 16t+16) of rows g (bits 0–15) and g+8 (bits 16–31),
// as two m16n8k16 halves. kRowSplit: lane t covers all 32 K of row g + 8t. The PTX ISA shows this
// only as a figure; the GPU test checks the default against the hardware and reports the other.
enum class MetaOrder { kHalfK, kRowSplit };
constexpr MetaOrder kDefaultMetaOrder = MetaOrder::kHalfK;

// All experts of one projection, in kernel layout.
//   data [E, M_pad/16, K_pad/256, 1408] bytes; chunk (e, mt, kc) at ((e·MT + mt)·KC + kc)·1408.
// Padding rows/columns have code 0, scale 0 and pattern {0,1}: they contribute exact zeros.
struct KernelWeights {
  int num_experts = 0;
  int64_t M = 0, K = 0;          // logical rows (output features) and contraction dim
  int64_t M_pad = 0, K_pad = 0;  // M rounded up to 16, K rounded up to 256
  MetaOrder meta_order = kDefaultMetaOrder;
  std::vector<uint8_t> data;
  std::vector<float> gamma;      // [E] γ_w of each expert (divisor); the GEMM epilogue uses 1/γ_w
  // [E] γ_w of rows m >= m_split, or empty (every row uses gamma): a fused gate|up whose up half has its
  // own global scale (ops::SparseGemmArgs::w_inv_gamma_hi).
  std::vector<float> gamma_hi;
  int64_t m_split = 0;
  int64_t m_tiles() const { return M_pad / kMmaM; }
  int64_t k_chunks() const { return K_pad / kChunkK; }
  size_t expert_bytes() const { return static_cast<size_t>(m_tiles() * k_chunks()) * kChunkBytes; }
};

int64_t padded_k(int64_t K);  // K rounded up to kChunkK

// Bit of a lane's 32-bit code word (one k-step) that holds bit `bit` (0..2 magnitude, 3 sign) of
// E2M1 A-fragment element `element` (0..7); docs/KERNEL_LAYOUT.md §2 draws the map.
int kernel_code_bit(int element, int bit);

// Reorders E experts (all [M, K], K % 32 == 0) into kernel layout. Error names the expert index and
// `name` when shapes differ or K is not a multiple of 32.
KernelWeights kernel_layout_from_sparse48(const std::vector<const format::Sparse48Tensor*>& experts,
                                          const std::string& name = "experts",
                                          MetaOrder meta_order = kDefaultMetaOrder);

// Inverse, for tests: expert e's weights unpacked from the kernel layout as dec(q)·dec(scale)
// (WITHOUT 1/γ), logical K order, zeros where pruned. out: [M, K] fp32.
void kernel_layout_unpack_ref(const KernelWeights& w, int e, float* out);
// The same on one expert's raw kernel-layout bytes ([M_pad/16, K_pad/256, 1408]); K may be K_pad, which
// yields zeros in the padding columns.
void kernel_layout_unpack_ref(const uint8_t* expert, int64_t M, int64_t K, int64_t M_pad, int64_t K_pad,
                              MetaOrder meta_order, float* out);

// The same values straight from the canonical paired 4:8 tensor (the oracle of the layout tests):
// decoded weights WITHOUT the tensor scale, dec(q)·dec(scale) at the kept
// positions, 0 elsewhere. out: [N, K] fp32 (exact).
void sparse48_decode_unscaled(const format::Sparse48Tensor& t, float* out);


// Order of K inside an activation row (the B operand), one per GEMM kernel that reads it
// (docs/KERNEL_LAYOUT.md §1):
//   kMmaFragment: 4:8→2:4 permutation (step 1) then the 32-wide B-fragment order (step 2), for the
//                 mma.sp m16n8k32 kernel (ops/sparse_gemm/sparse_gemm_mma.cu), whose lanes load B straight from
//                 global memory, 8 bf16 per 16-byte load;
//   kKMajor:      step 1 only, for the wgmma.mma_async.sp kernel (ops/sparse_gemm/sparse_gemm_wgmma.cu), which
//                 copies a K-major B tile into shared memory and lets the hardware pick fragments.
// The values are explicit so device code can take the layout as an int.
enum class ActLayout : int { kMmaFragment = 0, kKMajor = 1 };

// "mma-fragment" / "k-major". Error for a value outside the enum.
const char* act_layout_name(ActLayout layout);

// Storage index (inside a row of K_pad elements) of logical column k in `layout`. Both layouts
// permute K only inside each 32-wide block, so padding columns K..K_pad stay in place. Error for a
// layout value outside the enum.
int64_t act_storage_index(int64_t k, ActLayout layout = ActLayout::kMmaFragment);

}  // namespace moesq::format
