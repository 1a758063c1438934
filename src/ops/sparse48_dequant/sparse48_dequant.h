// Launcher: unpack a paired 4:8 NVFP4 tensor (format/nvfp4.h Sparse48Tensor, DESIGN.md §3) into fp32
// on the GPU, the device twin of format::sparse48_dequantize — bit for bit:
//   ŵ = (dec_E2M1(q) · dec_UE4M3(s_block)) / γ   at the 4 kept positions of each group of 8 (the
//   pattern from the group's metadata nibble: kept pairs i0 = nib & 3 < i1 = nib >> 2), 0 elsewhere;
//   one UE4M3 scale per 16 kept values (32 dense positions), γ the tensor scale (a divisor, Eq. 5).
// The refinement's held-out loss of what it packs (refine::StepBackend::packed_loss) uploads the
// packed bytes (≈ 1/12 of the fp32 weights) and unpacks them here instead of on a worker thread.
// CPU twin: sparse48_dequant_ref (format::sparse48_dequantize on the same descriptor, host pointers).
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

namespace moesq::ops {

struct Sparse48DequantArgs {
  int64_t N = 0, K = 0;             // rows and dense columns; K a multiple of 32
  const uint8_t* values = nullptr;  // [N, K/4] E2M1 nibbles of the kept values, low nibble first
  const uint8_t* meta = nullptr;    // [N, K/16] one pattern nibble per group, low nibble first
  const uint8_t* scales = nullptr;  // [N, K/32] UE4M3 block scale codes (finite: not 0x7f / 0xff)
  float global_scale = 1.0f;        // γ (> 0, finite)
  float* out = nullptr;             // [N, K] fp32 out (16-byte aligned on the device)
};

// Errors (moesq::Error): N < 0, K not a positive multiple of 32, a null pointer, γ not finite and > 0,
// a misaligned out. The kernel cannot see the bytes before it runs: for a metadata nibble that is not
// one of the 6 patterns it writes the group's zeros, for a scale code 0x7f / 0xff (not a finite UE4M3)
// an unspecified value; the twin names either.
void sparse48_dequant(const Sparse48DequantArgs& a, cudaStream_t stream);
void sparse48_dequant_check(const Sparse48DequantArgs& a);
void sparse48_dequant_ref(const Sparse48DequantArgs& a);

}  // namespace moesq::ops
