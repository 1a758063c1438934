// CPU twins of the swiglu_train launchers (swiglu_train.h).
#include "core/error.h"
#include "core/swiglu.h"
#include "ops/descale_rows/descale_rows.h"
#include "ops/fake_quant/fake_quant.h"
#include "ops/swiglu_train/swiglu_train.h"

namespace moesq::ops {

void swiglu_train_check(const SwigluTrainArgs& a, bool backward) {
  MOESQ_CHECK(a.rows >= 0 && a.I > 0, "swiglu_train: bad shape rows=", a.rows, " I=", a.I);
  MOESQ_CHECK(a.ab, "swiglu_train: ab is null");
  MOESQ_CHECK(backward ? (a.dh && a.dab) : a.h != nullptr, "swiglu_train: ", backward ? "dh/dab" : "h", " is null");
  MOESQ_CHECK((a.ab_row_gamma != nullptr) == (a.ab_gamma != nullptr) && (a.ab_gamma != nullptr) == (a.ab_out != nullptr),
              "swiglu_train: ab_row_gamma, ab_gamma and ab_out are given together or not at all");
}

void swiglu_train_forward_ref(const SwigluTrainArgs& a) {
  swiglu_train_check(a, false);
  const int64_t I = a.I;
  const float* ab = a.ab;
  if (a.ab_gamma) {  // the fused descale: a|b divided by the two γ into ab_out, then the SwiGLU of those
    for (int64_t i = 0; i < a.rows; ++i)
      for (int64_t c = 0; c < 2 * I; ++c)
        a.ab_out[i * 2 * I + c] = descale_value(a.ab[i * 2 * I + c], a.ab_row_gamma[i], *a.ab_gamma);
    ab = a.ab_out;
  }
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t c = 0; c < I; ++c) {
      const float x = ab[i * 2 * I + c];
      a.h[i * I + c] = silu_mul_with_sigmoid(x, sigmoid(x), ab[i * 2 * I + I + c]);
    }
  if (a.quantize) fake_quant_ref({.x = a.h, .rows = a.rows, .K = I, .block = a.block, .per_row = true,
                                  .amax = nullptr, .nonfinite = a.nonfinite, .unscaled_bf16 = a.h_unscaled_bf16,
                                  .gamma = a.h_gamma});
}

void swiglu_train_backward_ref(const SwigluTrainArgs& a) {
  swiglu_train_check(a, true);
  const int64_t I = a.I;
  for (int64_t i = 0; i < a.rows; ++i) {
    const float* ab = a.ab + i * 2 * I;
    const float* dh = a.dh + i * I;
    float* d = a.dab + i * 2 * I;
    for (int64_t c = 0; c < I; ++c) {
      const float s = sigmoid(ab[c]), silu = ab[c] * s;
      d[c] = dh[c] * ab[I + c] * s * (1.0f + ab[c] * (1.0f - s));  // silu'(a) = σ(1 + a(1 − σ))
      d[I + c] = dh[c] * silu;
    }
  }
}

}  // namespace moesq::ops
