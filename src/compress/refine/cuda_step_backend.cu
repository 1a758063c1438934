// The CUDA step backend (refine/cuda_step_backend.h). One step, for the batch rows order[b0, b0+m):
//   support (gumbel_support_forward, 3 projections in one launch) → W̃ = Q_w(Z ⊙ V) (fake_quant: gate|up one γ, down its own)
//   → gather X, Y_ref, w → a|b = X·W̃_guᵀ → h = Q_a(silu(a)·b) → Ŷ = h·W̃_downᵀ → dŶ (weighted_mse)
//   → dW̃_down = dŶᵀ·h, dh = dŶ·W̃_down → da|db (swiglu_train_backward) → dW̃_gu = [da|db]ᵀ·X
//   → dA, dV and Lion on A, V (gumbel_support_lion, 3 projections in one launch)
// — refine/objective.cpp's objective_grad and refine/lion.cpp's lion_step, in the same order.
// With RefineOptions::bf16_forward the two forward GEMMs read the unscaled NVFP4 operands in bf16
// (exact) on tensor cores, and the passes after them divide the γ out as they read (descale_value of
// ops/descale_rows.h, fused into swiglu_train and weighted_mse); the fp32 copies of X, h and W̃_down
// stay for the gradients.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>
#include <utility>

#include "compress/cuda_context.cuh"
#include "compress/refine/cuda_step_backend.h"
#include "compress/refine/options.h"
#include "core/cuda/check.cuh"
#include "core/cuda/dev_buf.cuh"
#include "core/error.h"
#include "ops/fake_quant/fake_quant.h"
#include "ops/gather_f32/gather_f32.h"
#include "ops/gumbel_support/gumbel_support.h"
#include "ops/sparse48_dequant/sparse48_dequant.h"
#include "ops/swiglu_train/swiglu_train.h"
#include "ops/weighted_mse/weighted_mse.h"

namespace moesq::compress::refine {

namespace {

using gpu::Scratch;

// A view of n elements of a thread's scratch (the backend's buffers: valid while it runs).
template <typename T>
struct View {
  T* p = nullptr;
  size_t n = 0;
  size_t bytes() const { return sizeof(T) * n; }
};
template <typename T>
View<T> take(Scratch<T>& s, size_t n) {
  return {s.get(n), n};
}

// The calling thread's device memory for its experts' refinements (one backend runs at a time on a
// thread): kept across experts, so starting one allocates nothing once the largest has been seen.
struct Workspace {
  Scratch<float> X, Y, w, W_gu, W_d, dW_gu, dW_d, xb, yb, wb, ab, h, y, dy, dh, dab, amax;
  Scratch<float> gX, gxb, gh, gW;                 // bf16_forward: γ of X's rows, of the batch, of h, of W̃
  Scratch<uint16_t> uX, uxb, uh, uW_gu, uW_d;     // bf16_forward: the unscaled operands (bf16 bits)
  std::array<Scratch<float>, 3> A, V, mom_A, mom_V;
  std::array<Scratch<uint8_t>, 3> fixed_pat;
  Scratch<uint8_t> packed;                        // packed_loss: the packed tensors' bytes; snapshot: patterns
  Scratch<int64_t> eval_idx, order;
  Scratch<double> row_loss;
  Scratch<int32_t> flag;
};
Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

// The calling thread's stage profile (set_stage_timing): events recorded around each stage.
struct StageTimer {
  bool on = false;
  StageTimes t;
  cudaEvent_t a = nullptr, b = nullptr;
  ~StageTimer() {
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
  }
  void begin(cudaStream_t s) {
    if (!on) return;
    if (!a) {
      MOESQ_CUDA_CHECK(cudaEventCreate(&a));
      MOESQ_CUDA_CHECK(cudaEventCreate(&b));
    }
    MOESQ_CUDA_CHECK(cudaEventRecord(a, s));
  }
  void end(cudaStream_t s, double StageTimes::*stage) {
    if (!on) return;
    MOESQ_CUDA_CHECK(cudaEventRecord(b, s));
    MOESQ_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    MOESQ_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.*stage += ms * 1e-3;
  }
};
StageTimer& stage_timer() {
  thread_local StageTimer st;
  return st;
}

// Row-major C[M, N] = A · Bᵀ, A [M, K] and B [N, K] bf16 (bits), C fp32, fp32 accumulation on tensor
// cores (cuBLAS's default math for bf16 inputs; the handle's mode is restored).
void gemm_bf16_nt(cublasHandle_t h, int64_t M, int64_t N, int64_t K, const uint16_t* A, const uint16_t* B, float* C) {
  const float alpha = 1.0f, beta = 0.0f;
  cublasMath_t mode;
  MOESQ_CUBLAS_CHECK(cublasGetMathMode(h, &mode));
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
  MOESQ_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(M),
                                  static_cast<int>(K), &alpha, B, CUDA_R_16BF, static_cast<int>(K), A, CUDA_R_16BF,
                                  static_cast<int>(K), &beta, C, CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
  MOESQ_CUBLAS_CHECK(cublasSetMathMode(h, mode));
}

// Row-major C[M, N] = op(A) · op(B) (+ beta·C) in fp32; op = transpose when ta / tb. lda, ldb, ldc are
// the row-major leading dimensions. (cuBLAS is column-major: C' = op(B)' · op(A)'.)
void gemm_rm(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
             const float* B, int64_t ldb, float* C, int64_t ldc, float beta = 0.0f) {
  const float alpha = 1.0f;
  MOESQ_CUBLAS_CHECK(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 static_cast<int>(N), static_cast<int>(M), static_cast<int>(K), &alpha, B,
                                 static_cast<int>(ldb), A, static_cast<int>(lda), &beta, C, static_cast<int>(ldc)));
}

// n host elements into a view of scratch s (stream-ordered, through the thread's pinned staging).
template <typename T>
View<T> upload(Scratch<T>& s, const T* host, size_t n, gpu::ThreadContext& ctx) {
  View<T> v = take(s, n);
  if (n) ctx.h2d(v.p, host, sizeof(T) * n);
  return v;
}

// The stage profile covers training steps only: evals switch it off for their duration.
struct ProfilePause {
  bool was = stage_timer().on;
  ProfilePause() { stage_timer().on = false; }
  ~ProfilePause() { stage_timer().on = was; }
};

class CudaStepBackend final : public StepBackend {
 public:
  bool draws_prior() const override { return true; }
  void start(const StepData& d, std::array<ProjState<float>, 3>& P, const std::array<const uint8_t*, 3>& fixed,
             const RefineOptions& o) override {
    MOESQ_CHECK(!d.variant.gate_bias && !d.variant.up_bias && !d.variant.down_bias && !d.variant.clamped,
                "refine on the GPU: this family's experts have biases / a clamped SwiGLU (gpt-oss), which the GPU "
                "refinement does not implement; use --device cpu");
    MOESQ_CHECK(d.act_block == 16 || d.act_block == 32, "refine on the GPU: activation block ", d.act_block,
                " (16 or 32 only)");
    int devices = 0;
    MOESQ_CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0,
                "refine on the GPU: no CUDA device found (use --device cpu)");
    ctx_ = &gpu::thread_context();
    Workspace& ws = workspace();
    MOESQ_CUBLAS_CHECK(cublasSetMathMode(ctx_->blas, o.tf32_gemm ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
    const cudaStream_t s = ctx_->stream;
    d_ = d;
    o_ = &o;
    H_ = d.H;
    I_ = d.I;
    C_ = std::max<int64_t>({d.max_batch, int64_t{256}, 1});  // rows per GEMM pass
    flag_ = take(ws.flag, 1);
    MOESQ_CUDA_CHECK(cudaMemsetAsync(flag_.p, 0, sizeof(int32_t), s));
    // Q_a on the inputs, once, here (bit-exact with the CPU backend's format::quantize_activation_row),
    // on a copy of the rows already on the device (DeviceRows) or of the host rows.
    const size_t nH = static_cast<size_t>(d.n * H_);
    if (d.X_dev) {
      X_ = take(ws.X, nH);
      if (nH) MOESQ_CUDA_CHECK(cudaMemcpyAsync(X_.p, d.X_dev, sizeof(float) * nH, cudaMemcpyDeviceToDevice, s));
    } else {
      X_ = upload(ws.X, d.X, nH, *ctx_);
    }
    bf16_ = o.bf16_forward;
    MOESQ_CHECK(!bf16_ || H_ % 2 == 0, "refine on the GPU: --gpu-gemm bf16-forward needs an even hidden size, got ",
                H_);
    if (bf16_) {
      uX_ = take(ws.uX, nH);
      gX_ = take(ws.gX, static_cast<size_t>(d.n));
    }
    if (d.n > 0)
      ops::fake_quant({.x = X_.p, .rows = d.n, .K = H_, .block = d.act_block, .per_row = true, .amax = nullptr,
                       .nonfinite = flag_.p, .unscaled_bf16 = bf16_ ? uX_.p : nullptr,
                       .gamma = bf16_ ? gX_.p : nullptr},
                      s);
    int32_t bad_x = 0;
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(&bad_x, flag_.p, sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
    MOESQ_CHECK(bad_x == 0, "refine on the GPU: the expert's calibration inputs X hold a NaN or an infinity");
    // Y_ref is only read: the device rows are used in place.
    Y_ = d.Y_ref_dev ? View<float>{const_cast<float*>(d.Y_ref_dev), nH} : upload(ws.Y, d.Y_ref, nH, *ctx_);
    w_ = upload(ws.w, d.w, static_cast<size_t>(d.n), *ctx_);
    eval_idx_ = upload(ws.eval_idx, d.eval_rows, static_cast<size_t>(d.n_eval), *ctx_);
    for (int j = 0; j < 3; ++j) {
      N_[j] = P[j].N;
      K_[j] = P[j].K;
      R_[j] = P[j].groups();
      fixed_[j] = fixed[j] != nullptr;
      fixed_host_[j] = fixed[j];
      V_[j] = upload(ws.V[j], P[j].V.data(), P[j].V.size(), *ctx_);
      mom_V_[j] = take(ws.mom_V[j], P[j].V.size());
      MOESQ_CUDA_CHECK(cudaMemsetAsync(mom_V_[j].p, 0, mom_V_[j].bytes(), s));
      if (fixed_[j]) {
        fixed_pat_[j] = upload(ws.fixed_pat[j], fixed[j], static_cast<size_t>(R_[j]), *ctx_);
      } else {
        const size_t nA = static_cast<size_t>(R_[j] * 6);  // A [R, 6]
        if (d.prior[j]) {  // Eq. 2 init drawn here (draws_prior), the host's prior_logits element for element
          A_[j] = take(ws.A[j], nA);
          const View<uint8_t> prior = upload(ws.fixed_pat[j], d.prior[j], static_cast<size_t>(R_[j]), *ctx_);
          ops::gumbel_prior_logits(
              {.R = R_[j], .prior = prior.p, .sigma = d.prior_sigma, .s = d.prior_s, .key = d.prior_key[j], .A = A_[j].p},
              s);
        } else {
          MOESQ_CHECK(P[j].A.size() == nA, "refine on the GPU: projection ", j, " has ", P[j].A.size(),
                      " pattern logits, expected ", nA);
          A_[j] = upload(ws.A[j], P[j].A.data(), nA, *ctx_);
        }
        mom_A_[j] = take(ws.mom_A[j], nA);
        MOESQ_CUDA_CHECK(cudaMemsetAsync(mom_A_[j].p, 0, mom_A_[j].bytes(), s));
      }
    }
    W_gu_ = take(ws.W_gu, static_cast<size_t>(2 * I_ * H_));
    W_d_ = take(ws.W_d, static_cast<size_t>(H_ * I_));
    dW_gu_ = take(ws.dW_gu, W_gu_.n);
    dW_d_ = take(ws.dW_d, W_d_.n);
    const size_t C = static_cast<size_t>(C_);
    xb_ = take(ws.xb, C * H_);
    yb_ = take(ws.yb, C * H_);
    wb_ = take(ws.wb, C);
    ab_ = take(ws.ab, C * 2 * I_);
    h_ = take(ws.h, C * I_);
    y_ = take(ws.y, C * H_);
    dy_ = take(ws.dy, C * H_);
    dh_ = take(ws.dh, C * I_);
    dab_ = take(ws.dab, C * 2 * I_);
    row_loss_ = take(ws.row_loss, C);
    amax_ = take(ws.amax, 2);
    if (bf16_) {
      gxb_ = take(ws.gxb, C);
      gh_ = take(ws.gh, C);
      gW_ = take(ws.gW, 2);
      uxb_ = take(ws.uxb, C * H_);
      uh_ = take(ws.uh, C * I_);
      uW_gu_ = take(ws.uW_gu, W_gu_.n);
      uW_d_ = take(ws.uW_d, W_d_.n);
    }
    // The host arrays uploaded above may be freed by the caller once start() returns.
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  void begin_epoch(const std::vector<int64_t>& order) override {
    order_ = take(workspace().order, order.size());
    if (!order.empty())
      MOESQ_CUDA_CHECK(cudaMemcpyAsync(order_.p, order.data(), sizeof(int64_t) * order.size(), cudaMemcpyHostToDevice,
                                       ctx_->stream));
    // The host vector may change before the copy runs: wait for it (once per epoch).
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
  }

  void step(const StepInput& in) override {
    const cudaStream_t s = ctx_->stream;
    MOESQ_CHECK(in.m > 0 && in.m <= C_ && in.b0 >= 0 && in.b0 + in.m <= static_cast<int64_t>(order_.n),
                "refine on the GPU: batch [", in.b0, ", ", in.b0 + in.m, ") outside the epoch's ", order_.n, " rows");
    StageTimer& T = stage_timer();
    weights(ops::SupportMode::kGumbel, in.kappa, in.tau, &in.gumbel_key);
    const int64_t m = in.m;
    T.begin(s);
    gather(order_.p + in.b0, m);
    T.end(s, &StageTimes::gather);
    forward(m, bf16_);
    T.begin(s);
    ops::weighted_mse({.rows = m, .H = H_, .y = y_.p, .y_ref = yb_.p, .w = wb_.p, .inv_norm = in.inv_norm,
                       .dy = dy_.p, .row_loss = nullptr, .y_row_gamma = y_scale(bf16_).first,
                       .y_gamma = y_scale(bf16_).second},
                      s);
    T.end(s, &StageTimes::loss);
    cublasHandle_t b = ctx_->blas;
    if (o_->tf32_backward) MOESQ_CUBLAS_CHECK(cublasSetMathMode(b, CUBLAS_TF32_TENSOR_OP_MATH));
    T.begin(s);
    gemm_rm(b, true, false, H_, I_, m, dy_.p, H_, h_.p, I_, dW_d_.p, I_);        // dW̃_down = dŶᵀ · h
    gemm_rm(b, false, false, m, I_, H_, dy_.p, H_, W_d_.p, I_, dh_.p, I_);       // dh = dŶ · W̃_down
    T.end(s, &StageTimes::gemm);
    T.begin(s);
    ops::swiglu_train_backward({.rows = m, .I = I_, .ab = ab_.p, .h = nullptr, .quantize = false, .block = 32,
                                .nonfinite = nullptr, .dh = dh_.p, .dab = dab_.p},
                               s);
    T.end(s, &StageTimes::swiglu);
    T.begin(s);
    gemm_rm(b, true, false, 2 * I_, H_, m, dab_.p, 2 * I_, xb_.p, H_, dW_gu_.p, H_);  // dW̃_gu = [da|db]ᵀ · X
    T.end(s, &StageTimes::gemm);
    if (o_->tf32_backward) MOESQ_CUBLAS_CHECK(cublasSetMathMode(b, CUBLAS_PEDANTIC_MATH));  // the next forward
    T.begin(s);
    const float* dW[3] = {dW_gu_.p, dW_gu_.p + I_ * H_, dW_d_.p};
    ops::GumbelSupportLionArgs lion[3];
    for (int j = 0; j < 3; ++j)
      lion[j] = {.R = R_[j], .dW = dW[j], .pi = nullptr, .fixed = fixed_[j] ? fixed_pat_[j].p : nullptr,
                 .kappa = in.kappa, .tau = in.tau, .recompute_pi = !fixed_[j], .key = in.gumbel_key[j],
                 .A = fixed_[j] ? nullptr : A_[j].p, .V = V_[j].p, .mom_A = fixed_[j] ? nullptr : mom_A_[j].p,
                 .mom_V = mom_V_[j].p, .lr_A = in.lr_A, .lr_V = in.lr_V, .beta1 = o_->beta1, .beta2 = o_->beta2,
                 .weight_decay = o_->weight_decay};
    ops::gumbel_support_lion(lion, 3, s);  // the three projections in one launch
    T.end(s, &StageTimes::lion);
    if (T.on) ++T.t.steps;
  }

  double eval_loss(bool hard, double kappa, double tau) override {
    const ProfilePause pause;
    weights(hard ? ops::SupportMode::kArgmax : ops::SupportMode::kNoiseFree, kappa, tau, nullptr);
    return eval_rows_loss(bf16_);
  }

  double weights_loss(const float* W_gate, const float* W_up, const float* W_down) override {
    const ProfilePause pause;
    const size_t n_gu = static_cast<size_t>(I_ * H_);
    ctx_->h2d(W_gu_.p, W_gate, sizeof(float) * n_gu);
    ctx_->h2d(W_gu_.p + n_gu, W_up, sizeof(float) * n_gu);
    ctx_->h2d(W_d_.p, W_down, sizeof(float) * n_gu);
    // The next step or eval recomputes W̃ from A and V (weights()), so overwriting it here is safe.
    // These weights come as fp32 values without their unscaled operands: the fp32 forward.
    return eval_rows_loss(/*bf16=*/false);
  }

  double packed_loss(const format::Sparse48Tensor& g, const format::Sparse48Tensor& u,
                     const format::Sparse48Tensor& d) override {
    const ProfilePause pause;
    const cudaStream_t s = ctx_->stream;
    const size_t n_gu = static_cast<size_t>(I_ * H_);
    const format::Sparse48Tensor* t[3] = {&g, &u, &d};
    float* out[3] = {W_gu_.p, W_gu_.p + n_gu, W_d_.p};
    const int64_t want[3][2] = {{I_, H_}, {I_, H_}, {H_, I_}};
    size_t bytes = 0;
    for (int j = 0; j < 3; ++j) {
      MOESQ_CHECK(t[j]->N == want[j][0] && t[j]->K == want[j][1], "refine on the GPU: packed projection ", j, " is [",
                  t[j]->N, ", ", t[j]->K, "], expected [", want[j][0], ", ", want[j][1], "]");
      bytes += t[j]->values.size() + t[j]->meta.size() + t[j]->scales.size();
    }
    // One upload of the three tensors' bytes, then the unpack of each into the forward's weights (the
    // next step or eval recomputes W̃ from A and V, so overwriting them here is safe).
    uint8_t* buf = take(workspace().packed, bytes).p;
    uint8_t* at = buf;
    for (int j = 0; j < 3; ++j) {
      const uint8_t* parts[3] = {t[j]->values.data(), t[j]->meta.data(), t[j]->scales.data()};
      const size_t sizes[3] = {t[j]->values.size(), t[j]->meta.size(), t[j]->scales.size()};
      const uint8_t* dev[3];
      for (int k = 0; k < 3; ++k) {
        if (sizes[k]) ctx_->h2d(at, parts[k], sizes[k]);
        dev[k] = at;
        at += sizes[k];
      }
      ops::sparse48_dequant({.N = t[j]->N, .K = t[j]->K, .values = dev[0], .meta = dev[1], .scales = dev[2],
                             .global_scale = t[j]->global_scale, .out = out[j]},
                            s);
    }
    return eval_rows_loss(/*bf16=*/false);
  }

  void snapshot(const std::array<float*, 3>& V, std::array<std::vector<uint8_t>, 3>& pat) override {
    const ProfilePause pause;
    const cudaStream_t s = ctx_->stream;
    // The argmax of the learned supports in one launch (its W output lands in the forward's W̃ scratch,
    // which the next step or eval recomputes), then the 1-byte patterns and V back to the host.
    uint8_t* dpat = take(workspace().packed, static_cast<size_t>(R_[0] + R_[1] + R_[2])).p;
    float* W[3] = {W_gu_.p, W_gu_.p + I_ * H_, W_d_.p};
    ops::GumbelSupportArgs args[3];
    uint8_t* at[3];
    int n = 0;
    int64_t off = 0;
    for (int j = 0; j < 3; ++j) {
      at[j] = dpat + off;
      off += R_[j];
      if (fixed_[j]) continue;
      args[n++] = {.R = R_[j], .mode = ops::SupportMode::kArgmax, .A = A_[j].p, .V = V_[j].p, .W = W[j],
                   .patterns = at[j]};
    }
    if (n) ops::gumbel_support_forward(args, n, s);
    for (int j = 0; j < 3; ++j) {
      pat[j].resize(static_cast<size_t>(R_[j]));
      if (fixed_[j])
        std::copy(fixed_host_[j], fixed_host_[j] + R_[j], pat[j].begin());
      else
        ctx_->d2h(pat[j].data(), at[j], static_cast<size_t>(R_[j]));
      if (V[j]) ctx_->d2h(V[j], V_[j].p, V_[j].bytes());
    }
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
    check_finite();
  }

  void sync(std::array<ProjState<float>, 3>& P) override {
    const cudaStream_t s = ctx_->stream;
    for (int j = 0; j < 3; ++j) {
      ctx_->d2h(P[j].V.data(), V_[j].p, V_[j].bytes());
      if (fixed_[j]) continue;
      P[j].A.resize(A_[j].n);  // empty where the prior was drawn here (draws_prior)
      ctx_->d2h(P[j].A.data(), A_[j].p, A_[j].bytes());
    }
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
    check_finite();
  }

 private:
  // Σ over the eval rows of the Eq. 4 row losses of the weights now in W_gu_ / W_d_, normalized.
  double eval_rows_loss(bool bf16) {
    const cudaStream_t s = ctx_->stream;
    double sum = 0.0;
    std::vector<double> rows(static_cast<size_t>(C_));
    for (int64_t r0 = 0; r0 < d_.n_eval; r0 += C_) {
      const int64_t m = std::min(C_, d_.n_eval - r0);
      gather(eval_idx_.p + r0, m);
      forward(m, bf16);
      ops::weighted_mse({.rows = m, .H = H_, .y = y_.p, .y_ref = yb_.p, .w = wb_.p, .inv_norm = d_.eval_inv_norm,
                         .dy = nullptr, .row_loss = row_loss_.p, .y_row_gamma = y_scale(bf16).first,
                         .y_gamma = y_scale(bf16).second},
                        s);
      MOESQ_CUDA_CHECK(cudaMemcpyAsync(rows.data(), row_loss_.p, sizeof(double) * m, cudaMemcpyDeviceToHost, s));
      MOESQ_CUDA_CHECK(cudaStreamSynchronize(s));
      for (int64_t i = 0; i < m; ++i) sum += rows[static_cast<size_t>(i)];
    }
    check_finite();
    return sum * d_.eval_inv_norm;
  }

  // W̃ = Q_w(Z ⊙ V) of the three projections into W_gu_ (gate rows, then up rows) and W_d_.
  void weights(ops::SupportMode relaxed_mode, double kappa, double tau, const std::array<uint64_t, 3>* keys) {
    const cudaStream_t s = ctx_->stream;
    StageTimer& T = stage_timer();
    float* W[3] = {W_gu_.p, W_gu_.p + I_ * H_, W_d_.p};
    T.begin(s);
    // Q_w's amax (gate|up one, down one) is reduced by the support pass itself (fake_quant amax_given).
    MOESQ_CUDA_CHECK(cudaMemsetAsync(amax_.p, 0, amax_.bytes(), s));
    ops::GumbelSupportArgs support[3];
    for (int j = 0; j < 3; ++j) {
      ops::GumbelSupportArgs& g = support[j];
      g.R = R_[j];
      g.mode = fixed_[j] ? ops::SupportMode::kFixed : relaxed_mode;
      g.A = fixed_[j] ? nullptr : A_[j].p;
      g.V = V_[j].p;
      g.fixed = fixed_[j] ? fixed_pat_[j].p : nullptr;
      g.kappa = kappa;
      g.tau = tau;
      g.key = keys ? (*keys)[j] : 0;
      g.pi = nullptr;  // Lion recomputes π from A and the key (recompute_pi): never stored
      g.W = W[j];
      g.amax = amax_.p + (j == 2 ? 1 : 0);
      g.nonfinite = flag_.p;
    }
    ops::gumbel_support_forward(support, 3, s);  // the three projections in one launch
    T.end(s, &StageTimes::support);
    T.begin(s);
    // With bf16_ the fp32 W̃_gate|up is not read again (the forward reads the unscaled operand, the
    // gradients do not use it): only the unscaled values are written. W̃_down stays fp32 for dh.
    ops::fake_quant({.x = W_gu_.p, .rows = 2 * I_, .K = H_, .block = 32, .per_row = false, .amax = amax_.p,
                     .nonfinite = flag_.p, .unscaled_bf16 = bf16_ ? uW_gu_.p : nullptr,
                     .gamma = bf16_ ? gW_.p : nullptr, .amax_given = true, .write_x = !bf16_},
                    s);
    ops::fake_quant({.x = W_d_.p, .rows = H_, .K = I_, .block = 32, .per_row = false, .amax = amax_.p + 1,
                     .nonfinite = flag_.p, .unscaled_bf16 = bf16_ ? uW_d_.p : nullptr,
                     .gamma = bf16_ ? gW_.p + 1 : nullptr, .amax_given = true},
                    s);
    T.end(s, &StageTimes::weight_quant);
  }

  // Rows idx [m] (device) of X, Y_ref, w into xb_, yb_, wb_ (and with bf16_ X's unscaled rows and γ
  // into uxb_, gxb_: a bf16 row of H values is moved as H/2 fp32 words; a padding row gets γ 0, which
  // ops/descale_rows maps to a zero row).
  void gather(const int64_t* idx, int64_t m) {
    ops::GatherF32Args g[5] = {
        {.src = X_.p, .src_rows = d_.n, .C = H_, .idx = idx, .m = m, .out = xb_.p},
        {.src = Y_.p, .src_rows = d_.n, .C = H_, .idx = idx, .m = m, .out = yb_.p},
        {.src = w_.p, .src_rows = d_.n, .C = 1, .idx = idx, .m = m, .out = wb_.p},
        {.src = reinterpret_cast<const float*>(uX_.p), .src_rows = d_.n, .C = H_ / 2, .idx = idx, .m = m,
         .out = reinterpret_cast<float*>(uxb_.p)},
        {.src = gX_.p, .src_rows = d_.n, .C = 1, .idx = idx, .m = m, .out = gxb_.p}};
    ops::gather_f32(g, bf16_ ? 5 : 3, ctx_->stream);  // one launch
  }

  // After a bf16 forward, y_ holds the raw GEMM of the unscaled operands: the loss divides it by h's row
  // γ and W̃_down's γ as it reads (weighted_mse's y_row_gamma / y_gamma); {null, null} otherwise.
  std::pair<const float*, const float*> y_scale(bool bf16) const {
    return bf16 ? std::pair<const float*, const float*>{gh_.p, gW_.p + 1} : std::pair<const float*, const float*>{};
  }

  // a|b = X·W̃_guᵀ, h = Q_a(silu(a)·b), Ŷ = h·W̃_downᵀ on the first m gathered rows; with bf16, both
  // GEMMs over the unscaled operands, the γ divided out by the passes that read their outputs (the
  // SwiGLU for a|b, the loss for Ŷ — ops/descale_rows.h's descale_value).
  void forward(int64_t m, bool bf16) {
    cublasHandle_t b = ctx_->blas;
    const cudaStream_t s = ctx_->stream;
    StageTimer& T = stage_timer();
    T.begin(s);
    if (bf16) {
      gemm_bf16_nt(b, m, 2 * I_, H_, uxb_.p, uW_gu_.p, ab_.p);  // descaled by the SwiGLU pass below
    } else {
      gemm_rm(b, false, true, m, 2 * I_, H_, xb_.p, H_, W_gu_.p, H_, ab_.p, 2 * I_);
    }
    T.end(s, &StageTimes::gemm);
    T.begin(s);
    ops::swiglu_train_forward({.rows = m, .I = I_, .ab = ab_.p, .h = h_.p, .quantize = true, .block = d_.act_block,
                               .nonfinite = flag_.p, .h_unscaled_bf16 = bf16 ? uh_.p : nullptr,
                               .h_gamma = bf16 ? gh_.p : nullptr, .ab_row_gamma = bf16 ? gxb_.p : nullptr,
                               .ab_gamma = bf16 ? gW_.p : nullptr, .ab_out = bf16 ? ab_.p : nullptr, .dh = nullptr,
                               .dab = nullptr},
                              s);
    T.end(s, &StageTimes::swiglu);
    T.begin(s);
    if (bf16) {
      gemm_bf16_nt(b, m, H_, I_, uh_.p, uW_d_.p, y_.p);  // raw: the loss reads it descaled (y_scale)
    } else {
      gemm_rm(b, false, true, m, H_, I_, h_.p, I_, W_d_.p, I_, y_.p, H_);
    }
    T.end(s, &StageTimes::gemm);
  }

  void check_finite() {
    int32_t bad = 0;
    MOESQ_CUDA_CHECK(cudaMemcpyAsync(&bad, flag_.p, sizeof(int32_t), cudaMemcpyDeviceToHost, ctx_->stream));
    MOESQ_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream));
    MOESQ_CHECK(bad == 0, "refine on the GPU: a weight or activation became NaN or infinite (the refinement "
                          "diverged; try smaller --lr-a / --lr-v)");
  }

  gpu::ThreadContext* ctx_ = nullptr;
  StepData d_;
  const RefineOptions* o_ = nullptr;
  int64_t H_ = 0, I_ = 0, C_ = 0;
  std::array<int64_t, 3> N_{}, K_{}, R_{};
  std::array<bool, 3> fixed_{};
  std::array<const uint8_t*, 3> fixed_host_{};  // the fixed patterns in the caller's memory (valid while it runs)
  bool bf16_ = false;  // RefineOptions::bf16_forward
  // Views of the thread's Workspace (workspace()).
  View<float> X_, Y_, w_;                // [n, H], [n, H], [n]
  View<int64_t> eval_idx_, order_;      // [n_eval], [n_train]
  std::array<View<float>, 3> A_, V_, mom_A_, mom_V_;
  std::array<View<uint8_t>, 3> fixed_pat_;
  View<float> W_gu_, W_d_, dW_gu_, dW_d_;  // [2I, H], [H, I]
  View<float> xb_, yb_, wb_, ab_, h_, y_, dy_, dh_, dab_;  // per-pass rows (C_)
  View<double> row_loss_;
  View<float> amax_;     // [2] Q_w amax scratch: gate|up, down
  // bf16_forward: the unscaled operands (bf16 bits) and their γ (ops/fake_quant.h).
  View<uint16_t> uX_, uxb_, uh_, uW_gu_, uW_d_;  // [n, H], [C, H], [C, I], [2I, H], [H, I]
  View<float> gX_, gxb_, gh_, gW_;              // [n], [C], [C], [2]: gate|up, down
  View<int32_t> flag_;   // [1] non-finite seen
};

}  // namespace

std::unique_ptr<StepBackend> make_cuda_step_backend() { return std::make_unique<CudaStepBackend>(); }

void set_stage_timing(bool on) {
  stage_timer().on = on;
  stage_timer().t = StageTimes{};
}
StageTimes stage_times() { return stage_timer().t; }

}  // namespace moesq::compress::refine
