// Lion with decoupled weight decay and the refinement schedules (see refine/lion.h). The fast and
// reference steps differ only in precision of the intermediate c; the tests compare both.
#include "compress/refine/lion.h"

#include <cmath>

#include "core/error.h"
#include "ops/gumbel_support/gumbel_math.h"

namespace moesq::compress::refine {

namespace {
double progress(int64_t step, int64_t num_steps) {
  MOESQ_CHECK(num_steps > 0 && step >= 0 && step < num_steps, "refine schedule: step ", step,
              " outside [0, ", num_steps, ")");
  return num_steps == 1 ? 0.0 : static_cast<double>(step) / static_cast<double>(num_steps - 1);
}
}  // namespace

void lion_step(float* __restrict theta, float* __restrict m, const float* __restrict g, int64_t n,
               double lr, const LionConfig& cfg) {
  const float b1 = static_cast<float>(cfg.beta1), b2 = static_cast<float>(cfg.beta2);
  const float step = static_cast<float>(lr), decay = static_cast<float>(lr * cfg.weight_decay);
  // The element update is ops::gumbel::lion_update (branchless sign, sign(0) = 0: the loop
  // vectorizes), the same expression the GPU refinement runs.
  for (int64_t i = 0; i < n; ++i) ops::gumbel::lion_update(theta[i], m[i], g[i], b1, b2, step, decay);
}

void lion_step_ref(float* theta, float* m, const float* g, int64_t n, double lr,
                   const LionConfig& cfg) {
  for (int64_t i = 0; i < n; ++i) {
    const double c = cfg.beta1 * m[i] + (1.0 - cfg.beta1) * g[i];
    const double update = (c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0)) + cfg.weight_decay * theta[i];
    theta[i] = static_cast<float>(theta[i] - lr * update);
    m[i] = static_cast<float>(cfg.beta2 * m[i] + (1.0 - cfg.beta2) * g[i]);
  }
}

double cosine_lr(double lr0, double final_frac, int64_t step, int64_t num_steps) {
  const double u = progress(step, num_steps);
  return lr0 * (final_frac + (1.0 - final_frac) * 0.5 * (1.0 + std::cos(M_PI * u)));
}

double linear_schedule(double v0, double v1, int64_t step, int64_t num_steps) {
  const double u = progress(step, num_steps);
  return v0 * (1.0 - u) + v1 * u;  // exact at both ends
}

}  // namespace moesq::compress::refine
