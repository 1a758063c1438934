// Internal to ops/gemm_bf16: the cp.async helpers of the small-M and large-M kernels.
#pragma once
#include <cstdint>

namespace moesq::ops::detail {

// 16 bytes global → shared, asynchronously; valid false: the 16 shared bytes are zero-filled (gmem is
// not read, but must be a valid address).
__device__ __forceinline__ void cp_async16(uint16_t* smem, const uint16_t* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

}  // namespace moesq::ops::detail
