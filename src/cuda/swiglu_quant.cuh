// Launcher: SwiGLU + requantization between the two expert GEMMs. The gate|up GEMM output
// h [E, capacity, 2I] (gate = columns [0, I), up = [I, 2I)) becomes the down GEMM's input batch
// a = NVFP4(silu(gate)·up) (or bf16 for W4A16) in kernel K order. CPU twin: moe::swiglu_quant_ref.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace moesq::cuda {

struct SwigluQuantArgs {
  const uint16_t* h = nullptr;       // [E, capacity, 2I] bf16 gate|up
  const int32_t* counts = nullptr;   // [E] device token counts (clamped to capacity here)
  int num_experts = 0, capacity = 0;
  int64_t I = 0, I_pad = 0;          // I % 32 == 0; I_pad = moe::padded_k(I)
  bool quantize = true;
  uint16_t* out = nullptr;           // [E, capacity, I_pad] bf16, kernel K order
  float* inv_scale = nullptr;        // [E, capacity] 1/γ_a
};

void swiglu_quant(const SwigluQuantArgs& args, cudaStream_t stream);

}  // namespace moesq::cuda
