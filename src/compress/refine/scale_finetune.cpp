// Scale-only fine-tuning (scale_finetune.h): frozen codes and patterns, Lion on one log-multiplier per
// UE4M3 block scale, the NVFP4 projection in the forward, straight-through in the backward.
#include "compress/refine/scale_finetune.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "compress/refine/lion.h"
#include "core/error.h"
#include "format/fp_codecs.h"

namespace moesq::compress::refine {

namespace {

constexpr int kBlock = format::kSparseScaleBlock;
constexpr float kMinScaleCode = 0x1p-9f;  // the smallest positive UE4M3 value (subnormal)

// One projection's state: unscaled values U = e2m1(q) ([N, K], 0 where pruned), the packed block
// scales s0 (real units), θ and its Lion momentum, the current projected codes and weights.
struct Proj {
  format::Sparse48Tensor* t = nullptr;
  std::vector<float> U, s0, theta, mom, grad, s, W;
  std::vector<uint8_t> codes;

  explicit Proj(format::Sparse48Tensor& tensor) : t(&tensor) {
    format::Sparse48Tensor unit = tensor;  // every block scale 1 and γ 1: dequantize gives e2m1(q) exactly
    std::fill(unit.scales.begin(), unit.scales.end(), format::ue4m3_encode(1.0f));
    unit.global_scale = 1.0f;
    U.resize(static_cast<size_t>(tensor.N * tensor.K));
    format::sparse48_dequantize(unit, U.data());
    const size_t B = tensor.scales.size();
    s0.resize(B);
    for (size_t b = 0; b < B; ++b) s0[b] = format::e4m3_decode(tensor.scales[b]) / tensor.global_scale;
    theta.assign(B, 0.0f), mom.assign(B, 0.0f), grad.assign(B, 0.0f), s = s0, codes = tensor.scales;
    W.resize(U.size());
  }
  void current_scales() {
    for (size_t b = 0; b < s.size(); ++b) s[b] = s0[b] > 0.0f ? s0[b] * std::exp(theta[b]) : 0.0f;
  }
  // Ŵ = e2m1(q) · dec(c') / γ' (format's dequant order).
  void weights(float gamma) {
    const int64_t K = t->K;
    for (int64_t n = 0; n < t->N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const float sc = format::e4m3_decode(codes[static_cast<size_t>((n * K + k) / kBlock)]);
        W[n * K + k] = U[n * K + k] * sc / gamma;
      }
  }
  // ∂L/∂θ_b = s_b · Σ_{j ∈ b} ∂L/∂Ŵ_j · e2m1(q_j)   (dW: [N, K]).
  void theta_grad(const float* dW) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    for (size_t j = 0; j < U.size(); ++j) grad[j / kBlock] += dW[j] * U[j];
    for (size_t b = 0; b < grad.size(); ++b) grad[b] *= s[b];
  }
};

// Projects the block scales of `ps` (sharing the stored γ) and writes each one's codes; returns γ'.
float project(const std::vector<Proj*>& ps, float gamma) {
  std::vector<float> all;
  for (Proj* p : ps) all.insert(all.end(), p->s.begin(), p->s.end());
  std::vector<uint8_t> codes(all.size());
  const float g = project_block_scales(all.data(), static_cast<int64_t>(all.size()), gamma, codes.data());
  size_t at = 0;
  for (Proj* p : ps) {
    std::copy_n(codes.begin() + static_cast<int64_t>(at), p->codes.size(), p->codes.begin());
    at += p->codes.size();
  }
  return g;
}

// Fisher–Yates from a 64-bit Mersenne twister (fully specified: the same order on every platform).
std::vector<int64_t> shuffled(const std::vector<int64_t>& ids, uint64_t key) {
  std::vector<int64_t> v = ids;
  std::mt19937_64 g(key);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(g() % i)]);
  return v;
}

}  // namespace

float project_block_scales(const float* s, int64_t n, float gamma, uint8_t* codes) {
  float mx = 0.0f;
  for (int64_t b = 0; b < n; ++b) mx = std::max(mx, s[b]);
  // γ stays unless the largest scale would pass 448 by more than the UE4M3 rounding that saturates to it.
  const float g = mx > 0.0f && mx * gamma > 448.0f * (1.0f + 0x1p-8f) ? 448.0f / mx : gamma;
  for (int64_t b = 0; b < n; ++b)
    codes[b] = s[b] > 0.0f ? format::ue4m3_encode(std::clamp(s[b] * g, kMinScaleCode, 448.0f)) : uint8_t{0};
  return g;
}

int64_t scale_finetune(format::Sparse48Tensor& gate, format::Sparse48Tensor& up, format::Sparse48Tensor& down,
                       const ScaleFinetuneRows& rows, const std::vector<int64_t>& train, uint64_t shuffle_key,
                       const ScaleFinetuneOptions& o) {
  const int64_t H = rows.H, I = rows.I;
  MOESQ_CHECK(gate.N == I && gate.K == H && up.N == I && up.K == H && down.N == H && down.K == I,
              "scale fine-tuning: projections [", gate.N, ", ", gate.K, "], [", up.N, ", ", up.K, "], [", down.N, ", ",
              down.K, "] do not match H=", H, " I=", I);
  MOESQ_CHECK(gate.global_scale == up.global_scale, "scale fine-tuning: gate_proj and up_proj have different global ",
              "scales (", gate.global_scale, ", ", up.global_scale, "); moesq packs them with one");
  MOESQ_CHECK(o.batch > 0 && o.micro_batch > 0 && o.lr >= 0 && o.epochs >= 0, "scale fine-tuning: bad options");
  if (o.epochs == 0 || train.empty()) return 0;
  Proj pg(gate), pu(up), pd(down);
  const float gamma_gu = gate.global_scale, gamma_d = down.global_scale;
  float g_gu = gamma_gu, g_d = gamma_d;
  const int64_t per_epoch = (static_cast<int64_t>(train.size()) + o.batch - 1) / o.batch;
  const int64_t total = per_epoch * o.epochs;
  const LionConfig lion{o.beta1, o.beta2, 0.0};
  ObjectiveWorkspace ws;
  std::vector<float> Xb, Yb, wb;
  int64_t t = 0;
  for (int e = 0; e < o.epochs; ++e) {
    const std::vector<int64_t> order = shuffled(train, shuffle_key + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(e + 1));
    for (int64_t b0 = 0; b0 < static_cast<int64_t>(order.size()); b0 += o.batch, ++t) {
      const int64_t m = std::min<int64_t>(o.batch, static_cast<int64_t>(order.size()) - b0);
      Xb.resize(m * H), Yb.resize(m * H), wb.resize(m);
      double sum_w = 0.0;
      for (int64_t i = 0; i < m; ++i) {
        const int64_t r = order[b0 + i];
        std::copy_n(rows.Xq + r * H, H, &Xb[i * H]);
        std::copy_n(rows.Y_ref + r * H, H, &Yb[i * H]);
        wb[i] = rows.w[r];
        sum_w += wb[i];
      }
      if (sum_w <= 0.0) continue;
      for (Proj* p : {&pg, &pu, &pd}) p->current_scales();
      g_gu = project({&pg, &pu}, gamma_gu);
      g_d = project({&pd}, gamma_d);
      pg.weights(g_gu), pu.weights(g_gu), pd.weights(g_d);
      ObjectiveInput<float> in;
      in.m = m, in.H = H, in.I = I, in.X = Xb.data(), in.Y_ref = Yb.data(), in.w = wb.data();
      in.inv_norm = 1.0 / (sum_w * static_cast<double>(H));
      in.act_block = rows.act_block;
      in.b_gate = rows.variant.gate_bias, in.b_up = rows.variant.up_bias, in.b_down = rows.variant.down_bias;
      in.clamped = rows.variant.clamped, in.alpha = rows.variant.alpha, in.limit = rows.variant.limit;
      const double loss = expert_grad(in, pg.W.data(), pu.W.data(), pd.W.data(), rows.act_block > 0, o.micro_batch, ws);
      MOESQ_CHECK(std::isfinite(loss), "scale fine-tuning: the loss became ", loss, " at step ", t);
      pg.theta_grad(ws.dW_gu.data());
      pu.theta_grad(ws.dW_gu.data() + I * H);
      pd.theta_grad(ws.dW_down.data());
      const double lr = cosine_lr(o.lr, o.lr_final_frac, t, total);
      for (Proj* p : {&pg, &pu, &pd})
        lion_step(p->theta.data(), p->mom.data(), p->grad.data(), static_cast<int64_t>(p->theta.size()), lr, lion);
    }
  }
  for (Proj* p : {&pg, &pu, &pd}) p->current_scales();
  g_gu = project({&pg, &pu}, gamma_gu);
  g_d = project({&pd}, gamma_d);
  gate.scales = pg.codes, up.scales = pu.codes, down.scales = pd.codes;
  gate.global_scale = up.global_scale = g_gu;
  down.global_scale = g_d;
  return t;
}

}  // namespace moesq::compress::refine
