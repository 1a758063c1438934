// SwiGLU expert forward on explicit weights, fp32 (BLAS), with optional NVFP4 activation
// quantization (Eq. 4's Q_a): y = down(Q_a(silu(gate Q_a(x)) ⊙ up Q_a(x))).
// The pipeline needs it on weights that are not (yet) installed in the model: the original expert
// (targets Y_e), the candidate compressed one (reconstruction error), and the inputs of down_proj.
#pragma once
#include <cstdint>
#include <vector>

namespace moesq::compress {

struct ExpertShape {
  int64_t H = 0;  // hidden size (K of gate/up, N of down)
  int64_t I = 0;  // expert intermediate size
};

// x [n, H]; gate, up [I, H]; down [H, I]. act_block 0 = no activation quantization.
// If `inter` is given it receives the down_proj input [n, I] (after Q_a).
std::vector<float> expert_forward(const ExpertShape& s, const float* gate, const float* up, const float* down,
                                  const float* x, int64_t n, int act_block, std::vector<float>* inter = nullptr);

// ‖a − b‖²_F / ‖a‖²_F (NaN when ‖a‖ = 0 and a ≠ b; 0 when both are zero)
double rel_sq_error(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace moesq::compress
