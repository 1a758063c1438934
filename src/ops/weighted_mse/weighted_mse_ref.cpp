// CPU twin of the weighted_mse launcher (weighted_mse.h): the loop of refine/objective.cpp.
#include "core/error.h"
#include "ops/descale_rows/descale_rows.h"
#include "ops/weighted_mse/weighted_mse.h"

namespace moesq::ops {

void weighted_mse_check(const WeightedMseArgs& a) {
  MOESQ_CHECK(a.rows >= 0 && a.H > 0, "weighted_mse: bad shape rows=", a.rows, " H=", a.H);
  MOESQ_CHECK(a.y && a.y_ref && a.w, "weighted_mse: y, y_ref and w are required");
  MOESQ_CHECK(a.dy || a.row_loss, "weighted_mse: no output (dy and row_loss are null)");
  MOESQ_CHECK((a.y_row_gamma == nullptr) == (a.y_gamma == nullptr),
              "weighted_mse: y_row_gamma and y_gamma are given together or not at all");
}

void weighted_mse_ref(const WeightedMseArgs& a) {
  weighted_mse_check(a);
  for (int64_t i = 0; i < a.rows; ++i) {
    double row = 0.0;
    const float coef = static_cast<float>(2.0 * a.w[i] * a.inv_norm);
    for (int64_t o = 0; o < a.H; ++o) {
      const float yv = a.y_gamma ? descale_value(a.y[i * a.H + o], a.y_row_gamma[i], *a.y_gamma) : a.y[i * a.H + o];
      const float r = yv - a.y_ref[i * a.H + o];
      row += static_cast<double>(r) * r;
      if (a.dy) a.dy[i * a.H + o] = coef * r;
    }
    if (a.row_loss) a.row_loss[i] = a.w[i] * row;
  }
}

}  // namespace moesq::ops
