// Where the per-step math of the refinement loop runs. refine/loop.cpp owns everything that decides
// WHAT a step is (the held-out split, the schedule rule, the shuffles, the batch boundaries, the step's
// κ, τ, rates and noise keys, the curves, the best-epoch choice, the final argmax and pack); a
// StepBackend owns the parameters while the loop runs and does the steps:
//   * the CPU backend (refine/loop.cpp): objective_grad (cblas) and lion_step on host memory;
//   * the CUDA backend (refine/cuda_step_backend.h): the same math as kernels (src/ops/gumbel_support,
//     fake_quant, swiglu_train, weighted_mse, gather_f32) and cuBLAS fp32 GEMMs, one expert's
//     parameters, Lion momenta and rows in GPU memory, on the calling thread's own stream.
// Both run one step from the same inputs, so a run on either device follows the same schedule and
// the same noise; they differ only by fp32 rounding (GEMM summation order, the libms' exp/log).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "compress/refine/objective.h"
#include "format/nvfp4.h"
#include "model/decoder.h"

namespace moesq::compress {
struct RefineOptions;
}

namespace moesq::compress::refine {

// The prepared rows of one expert (host memory; valid until the backend is destroyed).
struct StepData {
  int64_t n = 0, H = 0, I = 0;
  const float* X = nullptr;      // [n, H] inputs, raw: the backend applies Q_a (act_block) to them once, in
                                 // start() (format::quantize_activation_row; ops::fake_quant per row on a GPU)
  const float* Y_ref = nullptr;  // [n, H] the original expert's outputs
  // Device copies (GPU runs; ExpertData::X_dev): a device backend reads these instead of X / Y_ref.
  const float* X_dev = nullptr;
  const float* Y_ref_dev = nullptr;
  const float* w = nullptr;      // [n] row weights g^p
  const int64_t* eval_rows = nullptr;  // [n_eval] the rows the curves are measured on (held-out, or training)
  int64_t n_eval = 0;
  double eval_inv_norm = 0.0;    // 1 / (Σ_eval w · H)
  int64_t max_batch = 0;         // the largest batch a step takes
  int act_block = 32;            // Q_a block
  model::ExpertVariant variant;  // gpt-oss biases / clamped SwiGLU (the CPU backend only)
  // The prior initialization of A (Eq. 2 init) for a backend that draws it itself (draws_prior()):
  // per projection the prior pattern ids [R] (null: support fixed, or drawn on the host into P.A) and
  // the stream's key rng_key(seed, stream, kRngPriorInit, 0, j); σ and s of the prior.
  std::array<const uint8_t*, 3> prior{};
  std::array<uint64_t, 3> prior_key{};
  double prior_sigma = 0.0, prior_s = 0.0;
};

// One optimizer step: the rows order[b0, b0 + m) of the current epoch's order (begin_epoch).
struct StepInput {
  int64_t b0 = 0, m = 0;
  double inv_norm = 0.0;           // 1 / (Σ_batch w · H), summed in batch order
  double kappa = 100.0, tau = 2.0;
  std::array<uint64_t, 3> gumbel_key{};  // per projection (gate, up, down): rng_key(seed, stream, kRngGumbel, t, j)
  double lr_A = 0.0, lr_V = 0.0;
};

class StepBackend {
 public:
  virtual ~StepBackend() = default;
  // True when start() draws A from StepData::prior where it is used (refine::prior_logits' elements,
  // ops::gumbel_prior_logits); the loop then leaves P.A empty and start() must not read it.
  virtual bool draws_prior() const { return false; }
  // Takes the rows and the initial parameters (P: A [R, 6] where the support is learned, V [N, K];
  // fixed[j] non-null: projection j's support is held at those patterns); Lion momenta start at 0.
  // The CPU backend updates P in place from here on; a device backend copies it (sync reads it back).
  virtual void start(const StepData& data, std::array<ProjState<float>, 3>& P,
                     const std::array<const uint8_t*, 3>& fixed, const RefineOptions& o) = 0;
  // The training rows of this epoch in order (global row ids into StepData's arrays).
  virtual void begin_epoch(const std::vector<int64_t>& order) = 0;
  virtual void step(const StepInput& s) = 0;
  // Eq. 4 loss on the eval rows, with Q_w and Q_a: hard = the argmax support (what is packed), else the
  // noise-free relaxation at (κ, τ).
  virtual double eval_loss(bool hard, double kappa, double tau) = 0;
  // Eq. 4 loss on the eval rows of GIVEN weights, with Q_a and without Q_w: the dequantized values of a
  // packed expert (W_gate, W_up [I, H], W_down [H, I], fp32 host memory), i.e. the loss of exactly what
  // is written. The CPU backend's bits are refine's former packed_loss (objective.h expert_loss); a
  // device backend computes it where the rows already are (uploads the weights only).
  virtual double weights_loss(const float* W_gate, const float* W_up, const float* W_down) = 0;
  // weights_loss of PACKED weights (paired 4:8 NVFP4): the loss of exactly what is written. The default
  // unpacks on the host (format::sparse48_dequantize); a device backend uploads the packed bytes
  // (≈ 1/12 of the fp32) and unpacks them where the rows are (ops::sparse48_dequant, the same bits).
  virtual double packed_loss(const format::Sparse48Tensor& gate, const format::Sparse48Tensor& up,
                             const format::Sparse48Tensor& down);
  // The current values V and the argmax patterns of A (Algorithm 1 line 17; a fixed support: its fixed
  // patterns), into host memory: V[j] (null: not wanted) holds N·K floats of projection j, pat[j] is
  // resized to its R groups. The best-epoch snapshot and the final pack. The CPU backend reads P; a
  // device backend takes the argmax where A is (ops::gumbel_support_forward kArgmax: the same
  // argmax_pattern code) and reads back V and the 1-byte patterns, never A (Kimi-K2.5: 132 MB an expert).
  virtual void snapshot(const std::array<float*, 3>& V, std::array<std::vector<uint8_t>, 3>& pat) = 0;
  // The current A and V into P (the CPU backend works on P itself: nothing to do).
  virtual void sync(std::array<ProjState<float>, 3>& P) = 0;
};

// The CPU backend (refine/loop.cpp): the one RefineOptions::device = nullptr selects.
std::unique_ptr<StepBackend> make_cpu_step_backend();

}  // namespace moesq::compress::refine
