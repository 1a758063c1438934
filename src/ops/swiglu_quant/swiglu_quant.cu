// SwiGLU + requant kernel (swiglu_quant.cuh). One CTA per (expert, slot); CTAs past the expert's
// device-side count exit at once, so the grid can be sized from the capacity on the host.
//
// Non-obvious decision: silu(g)·u is rounded to bf16 BEFORE quantization, exactly like the CPU
// reference and like an unfused bf16 pipeline would, so fusing changes no value; only expf's last
// ulp may differ from the host libm (the test allows that, and only that).
#include "core/cuda/check.cuh"
#include "ops/common/nvfp4_row.cuh"
#include "ops/swiglu_quant/swiglu_quant.h"

namespace moesq::cuda {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) swiglu_quant_kernel(SwigluQuantArgs a) {
  extern __shared__ __align__(16) unsigned char s_raw[];  // [I] bf16 silu(gate)·up, or fp32 (h_f32, quantize)
  uint16_t* s_row = reinterpret_cast<uint16_t*>(s_raw);
  float* s_rowf = reinterpret_cast<float*>(s_raw);
  __shared__ float s_red[32];
  const int e = blockIdx.y, slot = blockIdx.x;
  const int count = min(a.counts[e], a.capacity);
  if (slot >= count) return;
  const int64_t s = static_cast<int64_t>(e) * a.capacity + slot;
  if (a.h_f32) {
    const float* h = a.h_f32 + s * 2 * a.I;
    for (int64_t i = threadIdx.x; i < a.I; i += blockDim.x) {
      const float g = h[i], u = h[a.I + i];
      const float y = g / (1.0f + expf(-g)) * u;
      if (a.quantize) s_rowf[i] = y;
      else s_row[i] = __bfloat16_as_ushort(__float2bfloat16_rn(y));
    }
  } else {
    const uint16_t* h = a.h + s * 2 * a.I;
    for (int64_t i = threadIdx.x; i < a.I; i += blockDim.x) {
      const float g = detail::bf16_bits_to_f32(h[i]), u = detail::bf16_bits_to_f32(h[a.I + i]);
      s_row[i] = __bfloat16_as_ushort(__float2bfloat16_rn(g / (1.0f + expf(-g)) * u));
    }
  }
  __syncthreads();
  if (a.h_f32 && a.quantize)
    detail::quantize_row_to_kernel_layout(s_rowf, static_cast<int>(a.I), static_cast<int>(a.I_pad), true,
                                          a.out + s * a.I_pad, a.inv_scale + s, s_red, static_cast<int>(a.layout));
  else
    detail::quantize_row_to_kernel_layout(s_row, static_cast<int>(a.I), static_cast<int>(a.I_pad), a.quantize,
                                        a.out + s * a.I_pad, a.inv_scale + s, s_red, static_cast<int>(a.layout));
}

}  // namespace

void swiglu_quant(const SwigluQuantArgs& a, cudaStream_t stream) {
  MOESQ_CHECK(a.I > 0 && a.I % detail::kActBlock == 0 && a.I_pad >= a.I && a.I_pad % 256 == 0, "swiglu_quant: I=",
              a.I, " I_pad=", a.I_pad, " (I must be a multiple of 32, I_pad of 256)");
  MOESQ_CHECK(a.num_experts > 0 && a.num_experts <= 65535 && a.capacity >= 0, "swiglu_quant: bad sizes E=",
              a.num_experts, " capacity=", a.capacity);
  MOESQ_CHECK(a.layout == moe::ActLayout::kMmaFragment || a.layout == moe::ActLayout::kKMajor,
              "swiglu_quant: unknown ActLayout ", static_cast<int>(a.layout));
  if (a.capacity == 0) return;
  MOESQ_CHECK((a.h != nullptr) != (a.h_f32 != nullptr), "swiglu_quant: give exactly one of h, h_f32");
  const size_t smem = (a.h_f32 && a.quantize ? sizeof(float) : sizeof(uint16_t)) * a.I;
  if (smem > 48 * 1024)
    MOESQ_CUDA_CHECK(cudaFuncSetAttribute(swiglu_quant_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
  swiglu_quant_kernel<<<dim3(a.capacity, a.num_experts), kThreads, smem, stream>>>(a);
  MOESQ_CUDA_LAUNCH_CHECK("swiglu_quant_kernel");
}

}  // namespace moesq::cuda
