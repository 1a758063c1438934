// The moesq refinement objective of ONE routed expert and its explicit backward (paper 002 Eq. 2–4):
//
//   per projection j ∈ {gate, up, down}:  π = softmax((κA + G)/τ), Z = Σ π_p ρ_p, Y = Z ⊙ V,
//                                         W̃ = Q_w(Y)   (Eq. 3 with the NVFP4 scales of Eq. 5)
//   expert:  a|b = Xq·[W̃_gate; W̃_up]ᵀ,  h = silu(a) ⊙ b,  Ŷ = Q_a(h)·W̃_downᵀ
//            (gpt-oss: a|b += b_gate|b_up, h = clamped_swiglu(a, b), Ŷ += b_down; ObjectiveInput)
//   loss:    L = Σ_i w_i ‖Y_ref,i − Ŷ_i‖² · inv_norm,   w_i = g_i^p,  inv_norm = 1/(Σ_batch w · H)
//
// Backward, written out (no autograd): dŶ = 2 w ⊙ (Ŷ − Y_ref)·inv_norm; dW̃_down = dŶᵀ·Q_a(h);
// dh = dŶ·W̃_down (STE through Q_a); da = dh ⊙ b ⊙ silu'(a), db = dh ⊙ silu(a);
// d[W̃_gate; W̃_up] = [da|db]ᵀ·Xq; then dY = dW̃ (STE through Q_w, scales held constant) and the
// softmax Jacobian of refine/gumbel_mask.h gives dA and dV.
//
// Non-obvious decision: gate and up are quantized with ONE shared tensor scale γ (Eq. 5 over the
// amax of both), exactly as they are packed for the fused gate|up GEMM; their latent weights are
// stacked as one [2I, H] matrix so the forward and the weight gradient are one GEMM each.
//
// Two implementations with the same math: objective_grad (float, cblas_sgemm, micro-batched; the
// one the refinement loop runs and a GPU version would replace) and objective_ref<T> (plain
// loops, float or double; its QuantMode::kFrozen turns the quantizers into fixed offsets so that
// finite differences can check the STE gradient exactly).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace moesq::compress::refine {

enum ProjIdx { kGate = 0, kUp = 1, kDown = 2 };

// Parameters (or their gradients) of one projection W [N, K]: R = N·K/8 groups.
template <typename T>
struct ProjState {
  int64_t N = 0, K = 0;
  std::vector<T> A;  // [R, 6] pattern logits (empty: support fixed, see ObjectiveInput::fixed)
  std::vector<T> V;  // [N, K] latent weights
  int64_t groups() const { return N * K / 8; }
};

template <typename T>
struct ObjectiveInput {
  int64_t m = 0, H = 0, I = 0;  // rows, hidden size, expert intermediate size
  const T* X = nullptr;         // [m, H] expert inputs, ALREADY activation-quantized (Q_a) when
                                //        quantization is on (they do not depend on the parameters)
  const T* Y_ref = nullptr;     // [m, H] original expert outputs
  const T* w = nullptr;         // [m] row weights g^p
  double inv_norm = 0.0;        // 1 / (Σ_batch w · H)
  std::array<const T*, 3> G{};  // [R_j, 6] Gumbel noise per projection; null → noise-free relaxation
  std::array<const uint8_t*, 3> fixed{};  // [R_j] fixed patterns per projection (V-only update or
                                          // the hard argmax evaluation); overrides A and G
  double kappa = 100.0, tau = 2.0;        // logit scale κ and temperature τ of Eq. 2
  int act_block = 32;                     // Q_a block along H and along I
  // The expert's variant (gpt-oss; model::ExpertVariant): constant biases after gate / up / down
  // ([I], [I], [H]; null = none), and with `clamped` h = clamped_swiglu(a, b) (core/swiglu.h) instead
  // of silu(a) ⊙ b, its gradient zero where a clamp is active.
  const T* b_gate = nullptr;
  const T* b_up = nullptr;
  const T* b_down = nullptr;
  bool clamped = false;
  double alpha = 1.702, limit = 7.0;
};

// Quantizer treatment in objective_ref.
enum class QuantMode {
  kOff,    // Q_w and Q_a are the identity: the smooth surrogate
  kSte,    // quantize in the forward, straight-through in the backward (what training does)
  kFrozen  // Q(x) := x + r with the residuals r captured by a kSte call: a smooth function equal
           // to the kSte loss at the capture point whose exact gradient IS the STE gradient there
};
template <typename T>
struct QuantResiduals {
  std::array<std::vector<T>, 3> w;  // Q_w(Y_j) − Y_j, [N_j, K_j]
  std::vector<T> h;                 // Q_a(h) − h, [m, I]
};

// Scratch buffers of objective_grad, reused across steps.
struct ObjectiveWorkspace {
  std::array<std::vector<float>, 3> pi, Z, dY;  // [R,6], [N,K], [N,K]
  std::vector<float> W_gu, W_down, dW_gu, dW_down;  // [2I,H], [H,I]
  std::vector<float> gu, h, y, dy, dh, dgu;         // per micro-batch activations
};

// Fast path: loss over the batch (micro-batches of `micro_batch` rows, gradients accumulated) and,
// when grad != nullptr, dA (if the projection is not fixed) and dV OVERWRITTEN into grad, which must
// be shaped like P. quant=false gives the smooth surrogate (kOff). Returns the loss.
double objective_grad(const ObjectiveInput<float>& in, const std::array<ProjState<float>, 3>& P,
                      bool quant, int64_t micro_batch, std::array<ProjState<float>, 3>* grad,
                      ObjectiveWorkspace& ws);

// Loss of given weights (e.g. a dequantized packed expert) on the rows of `in`: the same expert
// forward with Q_a when act_quant, but no support and no Q_w (G, fixed, κ, τ are not used).
// W_gate, W_up: [I, H]; W_down: [H, I].
double expert_loss(const ObjectiveInput<float>& in, const float* W_gate, const float* W_up,
                   const float* W_down, bool act_quant, int64_t micro_batch, ObjectiveWorkspace& ws);

// expert_loss with its gradient: the loss of the given weights on the rows of `in` (Q_a when act_quant,
// straight-through in the backward; no Q_w) and dL/dW into ws.dW_gu ([2I, H]: gate rows, then up rows)
// and ws.dW_down ([H, I]), overwritten. What the scale-only fine-tuning (refine/scale_finetune.h) steps on.
double expert_grad(const ObjectiveInput<float>& in, const float* W_gate, const float* W_up, const float* W_down,
                   bool act_quant, int64_t micro_batch, ObjectiveWorkspace& ws);

// Reference twin (plain loops, one pass over all m rows). kSte with res != nullptr captures the
// residuals; kFrozen reads them. Float and double overloads of one template.
double objective_ref(const ObjectiveInput<float>& in, const std::array<ProjState<float>, 3>& P,
                     QuantMode mode, QuantResiduals<float>* res,
                     std::array<ProjState<float>, 3>* grad);
double objective_ref(const ObjectiveInput<double>& in, const std::array<ProjState<double>, 3>& P,
                     QuantMode mode, QuantResiduals<double>* res,
                     std::array<ProjState<double>, 3>* grad);

// Q_w of Eq. 3 on the three soft-masked projections, in place: gate and up share the tensor scale
// γ = 448·6 / max(amax(Y_gate), amax(Y_up)) (Eq. 5), down has its own; 32-element scale blocks
// along K. Y_gu: [2I, H] (gate rows then up rows); Y_down: [H, I]. Returns {γ_gu, γ_down}.
std::array<float, 2> quantize_weights(float* Y_gu, int64_t I, int64_t H, float* Y_down);

}  // namespace moesq::compress::refine
