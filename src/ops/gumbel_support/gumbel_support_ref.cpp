// CPU twins of the gumbel_support launchers (gumbel_support.h), and their shared argument checks.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/gumbel_support/gumbel_math.h"
#include "ops/gumbel_support/gumbel_support.h"

namespace moesq::ops {

using namespace gumbel;

void gumbel_support_check(const GumbelSupportArgs& a) {
  MOESQ_CHECK(a.R >= 0, "gumbel_support: R=", a.R, " must be >= 0");
  MOESQ_CHECK(a.V && a.W, "gumbel_support: V and W are required");
  const bool relaxed = a.mode == SupportMode::kGumbel || a.mode == SupportMode::kNoiseFree;
  MOESQ_CHECK(a.mode == SupportMode::kFixed ? a.fixed != nullptr : a.A != nullptr,
              "gumbel_support: mode needs ", a.mode == SupportMode::kFixed ? "fixed patterns" : "logits A");
  MOESQ_CHECK(!relaxed || a.tau > 0, "gumbel_support: a relaxed mode needs tau > 0 (tau=", a.tau, ")");
}

void gumbel_support_check(const GumbelSupportLionArgs& a) {
  MOESQ_CHECK(a.R >= 0, "gumbel_support_lion: R=", a.R, " must be >= 0");
  MOESQ_CHECK(a.dW && a.V && a.mom_V, "gumbel_support_lion: dW, V and mom_V are required");
  MOESQ_CHECK(a.pi || a.recompute_pi ? (a.A && a.mom_A && a.tau > 0) : a.fixed != nullptr,
              "gumbel_support_lion: a relaxed support needs A, mom_A and tau > 0; a fixed one its patterns");
}

void gumbel_support_check(const GumbelPriorArgs& a) {
  MOESQ_CHECK(a.R >= 0, "gumbel_prior_logits: R=", a.R, " must be >= 0");
  MOESQ_CHECK(a.R == 0 || (a.prior && a.A), "gumbel_prior_logits: prior and A are required");
}

void gumbel_prior_logits_ref(const GumbelPriorArgs& a) {
  gumbel_support_check(a);
  for (int64_t r = 0; r < a.R; ++r) {
    MOESQ_CHECK(a.prior[r] < kNumPatterns, "gumbel_prior_logits: pattern id ", int(a.prior[r]), " of group ", r,
                " is not in [0, 6)");
    for (int p = 0; p < kNumPatterns; ++p) {
      const int64_t i = r * kNumPatterns + p;
      a.A[i] = prior_logit(a.prior[r], p, a.sigma, a.s, a.key, static_cast<uint64_t>(i));
    }
  }
}

void gumbel_support_forward_ref(const GumbelSupportArgs& a) {
  gumbel_support_check(a);
  float g[kNumPatterns], z[kGroup], pi_tmp[kNumPatterns];
  for (int64_t r = 0; r < a.R; ++r) {
    float* pi = a.pi ? a.pi + r * kNumPatterns : pi_tmp;
    const float* v = a.V + r * kGroup;
    float* w = a.W + r * kGroup;
    switch (a.mode) {
      case SupportMode::kGumbel:
        for (int p = 0; p < kNumPatterns; ++p) g[p] = rng_gumbel(a.key, static_cast<uint64_t>(r * kNumPatterns + p));
        soft_group_forward<float>(a.A + r * kNumPatterns, g, a.kappa, a.tau, pi, z);
        break;
      case SupportMode::kNoiseFree:
        soft_group_forward<float>(a.A + r * kNumPatterns, nullptr, a.kappa, a.tau, pi, z);
        break;
      case SupportMode::kArgmax: {
        const int p = argmax_pattern<float>(a.A + r * kNumPatterns);
        if (a.patterns) a.patterns[r] = static_cast<uint8_t>(p);
        z_of_pattern<float>(p, z);
        break;
      }
      case SupportMode::kFixed:
        MOESQ_CHECK(a.fixed[r] < kNumPatterns, "gumbel_support: pattern id ", int(a.fixed[r]), " of group ", r,
                    " is not in [0, 6)");
        z_of_pattern<float>(a.fixed[r], z);
        break;
    }
    for (int j = 0; j < kGroup; ++j) {
      w[j] = z[j] * v[j];
      if (a.nonfinite && !std::isfinite(w[j])) *a.nonfinite = 1;
      if (a.amax) *a.amax = std::max(*a.amax, std::fabs(w[j]));
    }
  }
}

void gumbel_support_lion_ref(const GumbelSupportLionArgs& a) {
  gumbel_support_check(a);
  const float scale = static_cast<float>(a.kappa / a.tau);
  const float b1 = static_cast<float>(a.beta1), b2 = static_cast<float>(a.beta2);
  const float step_A = static_cast<float>(a.lr_A), decay_A = static_cast<float>(a.lr_A * a.weight_decay);
  const float step_V = static_cast<float>(a.lr_V), decay_V = static_cast<float>(a.lr_V * a.weight_decay);
  float z[kGroup], da[kNumPatterns], dv[kGroup], g[kNumPatterns], pi_tmp[kNumPatterns];
  for (int64_t r = 0; r < a.R; ++r) {
    const bool relaxed = a.pi != nullptr || a.recompute_pi;
    const float* pi = a.recompute_pi ? pi_tmp : a.pi ? a.pi + r * kNumPatterns : nullptr;
    if (a.recompute_pi) {  // the forward's kGumbel π and Z of this group, A not yet updated
      for (int p = 0; p < kNumPatterns; ++p) g[p] = rng_gumbel(a.key, static_cast<uint64_t>(r * kNumPatterns + p));
      soft_group_forward<float>(a.A + r * kNumPatterns, g, a.kappa, a.tau, pi_tmp, z);
    } else if (relaxed) {
      z_from_pi<float>(pi, z);
    } else {
      MOESQ_CHECK(a.fixed[r] < kNumPatterns, "gumbel_support_lion: pattern id ", int(a.fixed[r]), " of group ", r,
                  " is not in [0, 6)");
      z_of_pattern<float>(a.fixed[r], z);
    }
    float* v = a.V + r * kGroup;
    soft_group_backward<float>(a.dW + r * kGroup, v, z, pi, scale, relaxed ? da : nullptr, dv);
    if (relaxed)
      for (int p = 0; p < kNumPatterns; ++p)
        lion_update(a.A[r * kNumPatterns + p], a.mom_A[r * kNumPatterns + p], da[p], b1, b2, step_A, decay_A);
    for (int j = 0; j < kGroup; ++j) lion_update(v[j], a.mom_V[r * kGroup + j], dv[j], b1, b2, step_V, decay_V);
  }
}

}  // namespace moesq::ops
