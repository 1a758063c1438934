// Internal to ops/gemm_bf16: the device pieces its mma.sync kernels share (the large-M path, the decode
// path, the W-as-A path, bench/probe_mma_order).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "ops/gemm_bf16/gemm_bf16.h"

namespace moesq::ops::detail {

// d += a · b for one m16n8k16 tile (bf16 in, fp32 accumulate); PTX ISA fragment layouts.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8×8 b16 matrices from shared memory (ldmatrix .x4): lanes 8i … 8i + 7 give the row addresses
// of matrix i, r[i] receives it in the mma fragment layout (PTX ISA, ldmatrix).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

// Output element o of a chain's value: y_f32 (+= with accumulate, rounded once) or y_bf16 (RNE).
__device__ __forceinline__ void store_y(const GemmBf16Args& a, int64_t o, float val) {
  if (a.y_f32)
    a.y_f32[o] = a.accumulate ? __fadd_rn(a.y_f32[o], val) : val;
  else
    a.y_bf16[o] = __bfloat16_as_ushort(__float2bfloat16_rn(val));
}

}  // namespace moesq::ops::detail
