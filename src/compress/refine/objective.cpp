// Refinement objective of one expert: fast float path (cblas_sgemm) and plain-loop reference.
// See refine/objective.h for the equations. The one non-obvious decision here: activations are
// processed in micro-batches with the weight gradients ACCUMULATED (GEMM beta = 1), so memory is
// bounded by the micro-batch while the optimizer step sees the whole batch; the loss normalization
// (inv_norm) is fixed per batch by the caller, so micro-batching does not change the math.
#include "compress/refine/objective.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "compress/refine/gumbel_mask.h"
#include "core/error.h"
#include "core/swiglu.h"
#include "format/nvfp4.h"

namespace moesq::compress::refine {

namespace {

template <typename T>
void check_shapes(const ObjectiveInput<T>& in, const std::array<ProjState<T>, 3>& P) {
  MOESQ_CHECK(in.H > 0 && in.I > 0 && in.m >= 0, "refine: bad expert shape m=", in.m,
              " H=", in.H, " I=", in.I);
  MOESQ_CHECK(in.H % format::kSparseScaleBlock == 0 && in.I % format::kSparseScaleBlock == 0,
              "refine: H=", in.H, " and I=", in.I, " must be multiples of ",
              format::kSparseScaleBlock, " (NVFP4 scale blocks along K)");
  MOESQ_CHECK(in.H % in.act_block == 0 && in.I % in.act_block == 0, "refine: activation block ",
              in.act_block, " does not divide H=", in.H, " and I=", in.I);
  const int64_t want_N[3] = {in.I, in.I, in.H}, want_K[3] = {in.H, in.H, in.I};
  static const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int j = 0; j < 3; ++j) {
    MOESQ_CHECK(P[j].N == want_N[j] && P[j].K == want_K[j], "refine: ", names[j], " is [", P[j].N,
                ", ", P[j].K, "], expected [", want_N[j], ", ", want_K[j], "]");
    MOESQ_CHECK(static_cast<int64_t>(P[j].V.size()) == P[j].N * P[j].K, "refine: ", names[j],
                " V has ", P[j].V.size(), " values, expected ", P[j].N * P[j].K);
    if (!in.fixed[j])
      MOESQ_CHECK(static_cast<int64_t>(P[j].A.size()) == P[j].groups() * kNumPatterns,
                  "refine: ", names[j], " A has ", P[j].A.size(), " logits, expected ",
                  P[j].groups() * kNumPatterns);
  }
}

// Z (and π when the support is relaxed) of projection j.
template <typename T>
void support_forward(const ObjectiveInput<T>& in, const ProjState<T>& p, int j, std::vector<T>& pi,
                     std::vector<T>& Z) {
  const int64_t R = p.groups();
  Z.resize(p.N * p.K);
  if (in.fixed[j]) {
    pattern_mask(in.fixed[j], R, Z.data());
  } else {
    pi.resize(R * kNumPatterns);
    soft_mask_forward(p.A.data(), in.G[j], R, in.kappa, in.tau, pi.data(), Z.data());
  }
}

// dY (= dW̃ under the STE) → dA, dV of projection j.
template <typename T>
void support_backward(const ObjectiveInput<T>& in, const ProjState<T>& p, int j,
                      const std::vector<T>& pi, const std::vector<T>& Z, const T* dY,
                      ProjState<T>& g) {
  g.N = p.N;
  g.K = p.K;
  g.V.resize(p.V.size());
  const bool relaxed = !in.fixed[j];
  if (relaxed) g.A.resize(p.A.size());
  else g.A.clear();
  soft_mask_backward(dY, p.V.data(), Z.data(), relaxed ? pi.data() : nullptr, p.groups(),
                     in.kappa, in.tau, relaxed ? g.A.data() : nullptr, g.V.data());
}

// a|b [2I] of one row += b_gate|b_up (gpt-oss); nothing without biases.
template <typename T>
void add_biases(const ObjectiveInput<T>& in, T* ab, int64_t I) {
  if (in.b_gate)
    for (int64_t c = 0; c < I; ++c) ab[c] += in.b_gate[c];
  if (in.b_up)
    for (int64_t c = 0; c < I; ++c) ab[I + c] += in.b_up[c];
}

// One micro-batch of rows through the expert: returns its loss, accumulates dW when asked.
double expert_chunk(const ObjectiveInput<float>& in, int64_t r0, int64_t mm, bool quant,
                    ObjectiveWorkspace& ws, bool want_grad) {
  const int64_t H = in.H, I = in.I, I2 = 2 * in.I;
  const float* X = in.X + r0 * H;          // [mm, H]
  const float* Yref = in.Y_ref + r0 * H;   // [mm, H]
  const float* w = in.w + r0;              // [mm]
  ws.gu.resize(mm * I2);
  ws.h.resize(mm * I);
  ws.y.resize(mm * H);
  // a|b = X · W_guᵀ   [mm, 2I]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mm, I2, H, 1.0f, X, H, ws.W_gu.data(), H,
              0.0f, ws.gu.data(), I2);
  const float alpha = static_cast<float>(in.alpha), limit = static_cast<float>(in.limit);
  for (int64_t i = 0; i < mm; ++i) {
    float* a = &ws.gu[i * I2];
    float* h = &ws.h[i * I];
    add_biases(in, a, I);
    if (in.clamped)
      for (int64_t c = 0; c < I; ++c) h[c] = clamped_swiglu(a[c], a[I + c], alpha, limit);
    else
      for (int64_t c = 0; c < I; ++c) h[c] = silu_mul_with_sigmoid(a[c], sigmoid(a[c]), a[I + c]);
    if (quant) format::quantize_activation_row(h, I, in.act_block);  // Q_a(h), STE below
  }
  // Ŷ = Q_a(h) · W_downᵀ (+ b_down)   [mm, H]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, mm, H, I, 1.0f, ws.h.data(), I,
              ws.W_down.data(), I, 0.0f, ws.y.data(), H);
  if (in.b_down)
    for (int64_t i = 0; i < mm; ++i)
      for (int64_t o = 0; o < H; ++o) ws.y[i * H + o] += in.b_down[o];
  double loss = 0.0;
  if (want_grad) ws.dy.resize(mm * H);
  for (int64_t i = 0; i < mm; ++i) {
    double row = 0.0;
    const float coef = static_cast<float>(2.0 * w[i] * in.inv_norm);
    for (int64_t o = 0; o < H; ++o) {
      const float r = ws.y[i * H + o] - Yref[i * H + o];
      row += static_cast<double>(r) * r;
      if (want_grad) ws.dy[i * H + o] = coef * r;
    }
    loss += w[i] * row;
  }
  loss *= in.inv_norm;
  if (!want_grad) return loss;
  ws.dh.resize(mm * I);
  ws.dgu.resize(mm * I2);
  // dW_down += dŶᵀ · Q_a(h)   [H, I]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, H, I, mm, 1.0f, ws.dy.data(), H,
              ws.h.data(), I, 1.0f, ws.dW_down.data(), I);
  // dh = dŶ · W_down   [mm, I]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, mm, I, H, 1.0f, ws.dy.data(), H,
              ws.W_down.data(), I, 0.0f, ws.dh.data(), I);
  for (int64_t i = 0; i < mm; ++i) {
    const float* a = &ws.gu[i * I2];
    const float* dh = &ws.dh[i * I];
    float* d = &ws.dgu[i * I2];
    if (in.clamped) {
      for (int64_t c = 0; c < I; ++c) {
        float dga = 0.0f, dgb = 0.0f;
        clamped_swiglu_grad(a[c], a[I + c], alpha, limit, &dga, &dgb);
        d[c] = dh[c] * dga;
        d[I + c] = dh[c] * dgb;
      }
      continue;
    }
    for (int64_t c = 0; c < I; ++c) {
      const float s = sigmoid(a[c]), silu = a[c] * s;
      d[c] = dh[c] * a[I + c] * s * (1.0f + a[c] * (1.0f - s));  // silu'(a) = σ(1 + a(1 − σ))
      d[I + c] = dh[c] * silu;
    }
  }
  // d[W_gate; W_up] += [da|db]ᵀ · X   [2I, H]
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, I2, H, mm, 1.0f, ws.dgu.data(), I2, X, H,
              1.0f, ws.dW_gu.data(), H);
  return loss;
}

}  // namespace

std::array<float, 2> quantize_weights(float* Y_gu, int64_t I, int64_t H, float* Y_down) {
  const float g_gu = format::gate_up_tensor_scale(Y_gu, Y_gu + I * H, I * H);
  const float g_d = format::nvfp4_tensor_scale(format::amax_abs(Y_down, H * I));
  format::nvfp4_fake_quant_blocks(Y_gu, 2 * I * H, format::kSparseScaleBlock, g_gu);
  format::nvfp4_fake_quant_blocks(Y_down, H * I, format::kSparseScaleBlock, g_d);
  return {g_gu, g_d};
}

double objective_grad(const ObjectiveInput<float>& in, const std::array<ProjState<float>, 3>& P,
                      bool quant, int64_t micro_batch, std::array<ProjState<float>, 3>* grad,
                      ObjectiveWorkspace& ws) {
  check_shapes(in, P);
  const int64_t H = in.H, I = in.I;
  MOESQ_CHECK(micro_batch > 0, "refine: micro-batch must be positive, got ", micro_batch);
  for (int j = 0; j < 3; ++j) support_forward(in, P[j], j, ws.pi[j], ws.Z[j]);
  ws.W_gu.resize(2 * I * H);
  ws.W_down.resize(H * I);
  for (int j = 0; j < 2; ++j)
    for (int64_t i = 0; i < I * H; ++i)
      ws.W_gu[j * I * H + i] = ws.Z[j][i] * P[j].V[i];  // Y = Z ⊙ V
  for (int64_t i = 0; i < H * I; ++i) ws.W_down[i] = ws.Z[kDown][i] * P[kDown].V[i];
  if (quant) quantize_weights(ws.W_gu.data(), I, H, ws.W_down.data());  // W̃ = Q_w(Y)
  if (grad) {
    ws.dW_gu.assign(2 * I * H, 0.0f);
    ws.dW_down.assign(H * I, 0.0f);
  }
  double loss = 0.0;
  for (int64_t r0 = 0; r0 < in.m; r0 += micro_batch)
    loss += expert_chunk(in, r0, std::min(micro_batch, in.m - r0), quant, ws, grad != nullptr);
  if (grad) {
    support_backward(in, P[kGate], kGate, ws.pi[kGate], ws.Z[kGate], ws.dW_gu.data(),
                     (*grad)[kGate]);
    support_backward(in, P[kUp], kUp, ws.pi[kUp], ws.Z[kUp], ws.dW_gu.data() + I * H,
                     (*grad)[kUp]);
    support_backward(in, P[kDown], kDown, ws.pi[kDown], ws.Z[kDown], ws.dW_down.data(),
                     (*grad)[kDown]);
  }
  return loss;
}

namespace {
double weights_pass(const ObjectiveInput<float>& in, const float* W_gate, const float* W_up, const float* W_down,
                    bool act_quant, int64_t micro_batch, ObjectiveWorkspace& ws, bool want_grad) {
  MOESQ_CHECK(micro_batch > 0, "refine: micro-batch must be positive, got ", micro_batch);
  const int64_t H = in.H, I = in.I;
  ws.W_gu.assign(W_gate, W_gate + I * H);
  ws.W_gu.insert(ws.W_gu.end(), W_up, W_up + I * H);
  ws.W_down.assign(W_down, W_down + H * I);
  if (want_grad) {
    ws.dW_gu.assign(2 * I * H, 0.0f);
    ws.dW_down.assign(H * I, 0.0f);
  }
  double loss = 0.0;
  for (int64_t r0 = 0; r0 < in.m; r0 += micro_batch)
    loss += expert_chunk(in, r0, std::min(micro_batch, in.m - r0), act_quant, ws, want_grad);
  return loss;
}
}  // namespace

double expert_loss(const ObjectiveInput<float>& in, const float* W_gate, const float* W_up,
                   const float* W_down, bool act_quant, int64_t micro_batch, ObjectiveWorkspace& ws) {
  return weights_pass(in, W_gate, W_up, W_down, act_quant, micro_batch, ws, false);
}

double expert_grad(const ObjectiveInput<float>& in, const float* W_gate, const float* W_up, const float* W_down,
                   bool act_quant, int64_t micro_batch, ObjectiveWorkspace& ws) {
  return weights_pass(in, W_gate, W_up, W_down, act_quant, micro_batch, ws, true);
}

namespace {
template <typename T>
double objective_ref_impl(const ObjectiveInput<T>& in, const std::array<ProjState<T>, 3>& P,
                     QuantMode mode, QuantResiduals<T>* res, std::array<ProjState<T>, 3>* grad) {
  check_shapes(in, P);
  MOESQ_CHECK(mode != QuantMode::kFrozen || res, "refine: kFrozen needs captured residuals");
  const int64_t m = in.m, H = in.H, I = in.I;
  std::array<std::vector<T>, 3> pi, Z, W;
  for (int j = 0; j < 3; ++j) {
    support_forward(in, P[j], j, pi[j], Z[j]);
    W[j].resize(Z[j].size());
    for (size_t i = 0; i < Z[j].size(); ++i) W[j][i] = Z[j][i] * P[j].V[i];  // Y = Z ⊙ V
  }
  if (mode == QuantMode::kSte) {  // W̃ = Q_w(Y) through the float quantizer
    std::vector<float> gu(2 * I * H), d(H * I);
    for (int64_t i = 0; i < I * H; ++i) {
      gu[i] = static_cast<float>(W[kGate][i]);
      gu[I * H + i] = static_cast<float>(W[kUp][i]);
    }
    for (int64_t i = 0; i < H * I; ++i) d[i] = static_cast<float>(W[kDown][i]);
    quantize_weights(gu.data(), I, H, d.data());
    for (int j = 0; j < 3; ++j) {
      const float* q = j == kDown ? d.data() : gu.data() + j * I * H;
      if (res) res->w[j].resize(W[j].size());
      for (size_t i = 0; i < W[j].size(); ++i) {
        if (res) res->w[j][i] = static_cast<T>(q[i]) - W[j][i];
        W[j][i] = static_cast<T>(q[i]);
      }
    }
  } else if (mode == QuantMode::kFrozen) {
    for (int j = 0; j < 3; ++j)
      for (size_t i = 0; i < W[j].size(); ++i) W[j][i] += res->w[j][i];
  }
  // Expert forward.
  std::vector<T> a(m * I), b(m * I), hq(m * I), y(m * H);
  const T alpha = static_cast<T>(in.alpha), limit = static_cast<T>(in.limit);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < I; ++c) {
      T sa = 0, sb = 0;
      for (int64_t k = 0; k < H; ++k) {
        sa += in.X[i * H + k] * W[kGate][c * H + k];
        sb += in.X[i * H + k] * W[kUp][c * H + k];
      }
      if (in.b_gate) sa += in.b_gate[c];
      if (in.b_up) sb += in.b_up[c];
      a[i * I + c] = sa;
      b[i * I + c] = sb;
      hq[i * I + c] = in.clamped ? clamped_swiglu(sa, sb, alpha, limit) : silu_mul_with_sigmoid(sa, sigmoid(sa), sb);
    }
  if (mode == QuantMode::kSte) {
    if (res) res->h.resize(m * I);
    std::vector<float> row(I);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < I; ++c) row[c] = static_cast<float>(hq[i * I + c]);
      format::quantize_activation_row(row.data(), I, in.act_block);
      for (int64_t c = 0; c < I; ++c) {
        if (res) res->h[i * I + c] = static_cast<T>(row[c]) - hq[i * I + c];
        hq[i * I + c] = static_cast<T>(row[c]);
      }
    }
  } else if (mode == QuantMode::kFrozen) {
    for (int64_t i = 0; i < m * I; ++i) hq[i] += res->h[i];
  }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < H; ++o) {
      T s = 0;
      for (int64_t c = 0; c < I; ++c) s += hq[i * I + c] * W[kDown][o * I + c];
      y[i * H + o] = in.b_down ? s + in.b_down[o] : s;
    }
  double loss = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    double row = 0.0;
    for (int64_t o = 0; o < H; ++o) {
      const double r = static_cast<double>(y[i * H + o]) - static_cast<double>(in.Y_ref[i * H + o]);
      row += r * r;
    }
    loss += static_cast<double>(in.w[i]) * row;
  }
  loss *= in.inv_norm;
  if (!grad) return loss;
  // Backward.
  std::vector<T> dy(m * H), dh(m * I, T(0));
  std::vector<T> dW_gate(I * H, T(0)), dW_up(I * H, T(0)), dW_down(H * I, T(0));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < H; ++o)
      dy[i * H + o] = static_cast<T>(2.0 * in.w[i] * in.inv_norm) * (y[i * H + o] - in.Y_ref[i * H + o]);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t o = 0; o < H; ++o)
      for (int64_t c = 0; c < I; ++c) {
        dW_down[o * I + c] += dy[i * H + o] * hq[i * I + c];
        dh[i * I + c] += dy[i * H + o] * W[kDown][o * I + c];  // STE through Q_a
      }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t c = 0; c < I; ++c) {
      const T av = a[i * I + c], s = sigmoid(av);
      T da = dh[i * I + c] * b[i * I + c] * s * (T(1) + av * (T(1) - s));
      T db = dh[i * I + c] * av * s;
      if (in.clamped) {
        T dga = 0, dgb = 0;
        clamped_swiglu_grad(av, b[i * I + c], alpha, limit, &dga, &dgb);
        da = dh[i * I + c] * dga;
        db = dh[i * I + c] * dgb;
      }
      for (int64_t k = 0; k < H; ++k) {
        dW_gate[c * H + k] += da * in.X[i * H + k];
        dW_up[c * H + k] += db * in.X[i * H + k];
      }
    }
  // STE through Q_w: dY = dW̃.
  support_backward(in, P[kGate], kGate, pi[kGate], Z[kGate], dW_gate.data(), (*grad)[kGate]);
  support_backward(in, P[kUp], kUp, pi[kUp], Z[kUp], dW_up.data(), (*grad)[kUp]);
  support_backward(in, P[kDown], kDown, pi[kDown], Z[kDown], dW_down.data(), (*grad)[kDown]);
  return loss;
}

}  // namespace

double objective_ref(const ObjectiveInput<float>& in, const std::array<ProjState<float>, 3>& P,
                     QuantMode mode, QuantResiduals<float>* res,
                     std::array<ProjState<float>, 3>* grad) {
  return objective_ref_impl(in, P, mode, res, grad);
}
double objective_ref(const ObjectiveInput<double>& in, const std::array<ProjState<double>, 3>& P,
                     QuantMode mode, QuantResiduals<double>* res,
                     std::array<ProjState<double>, 3>* grad) {
  return objective_ref_impl(in, P, mode, res, grad);
}

}  // namespace moesq::compress::refine
