// The paired 4:8 NVFP4 expert backends: ops::sparse_gemm on the 2.75 bit/weight kernel layout
// (format/kernel_layout.h), with NVFP4 activations (sparse-w4a4: dispatch and SwiGLU requantize) or bf16
// activations (sparse-w4a16: same kernel, values only permuted) — ONE backend with W4A4 as its flag.
// Non-obvious: gate|up is one [2I, H] projection (gate rows first, as ops::swiglu_quant expects). moesq
// writes one global scale γ for both (docs/FORMAT.md); the paper's reference writes one each, and then
// the up rows (m >= I) get their own 1/γ in the GEMM epilogue (KernelWeights::gamma_hi) — exact, never
// a rescale of the block scales. The GEMM epilogue multiplies by 1/γ_w, inverted at upload. A W4A4
// checkpoint with static activation scales quantizes each expert's inputs with its stored γ_a.
#pragma once
#include <vector>

#include "format/kernel_layout.h"
#include "runtime/experts/expert_backend.h"

namespace moesq::runtime {

struct PairedSparseHostExperts : HostExperts {
  // The experts [begin, end) (HostExperts), expert begin first.
  format::KernelWeights gu;    // gate|up [n, 2I, H] (M = 2I), γ_w per expert
  format::KernelWeights down;  // down [n, H, I] (M = H)
  // Static activation γ_a per expert (W4A4 with input_activations.dynamic false: io::read_static_act_scales)
  // of the gate|up input and of the down input, [E] each for EVERY expert of the layer (the dispatch and
  // SwiGLU index them by expert id); empty: γ_a per token row (Eq. 5).
  std::vector<float> act_gamma_gu, act_gamma_down;
};

}  // namespace moesq::runtime
