// The default refinement schedule rule (refine/schedule.h has the formula and its source).
#include "compress/refine/schedule.h"

#include <algorithm>
#include <cmath>

namespace moesq::compress {

RefineSchedule refine_schedule(int64_t train_rows, int64_t fixed_batch, int fixed_epochs) {
  namespace r = schedule_rule;
  RefineSchedule s;
  if (fixed_epochs > 0) s.epochs = fixed_epochs;
  if (fixed_batch > 0) s.batch = fixed_batch;
  if (train_rows <= 0) return s;
  if (fixed_batch <= 0) {
    while (s.batch > r::kMinBatch && (train_rows + s.batch - 1) / s.batch < r::kMinStepsPerEpoch) s.batch /= 2;
    // Large-batch regime: more rows go into each step instead of more steps, up to the cap.
    const double cap = std::min(static_cast<double>(r::kMaxBatch),
                                r::kBatchRef * std::sqrt(r::kRowsRef / static_cast<double>(train_rows)));
    while (static_cast<double>(2 * s.batch) <= cap && (train_rows + s.batch - 1) / s.batch >= r::kMaxStepsPerEpoch)
      s.batch *= 2;
  }
  s.steps = static_cast<int64_t>(s.epochs) * ((train_rows + s.batch - 1) / s.batch);
  const double ratio = std::max(1.0, r::kStepsRef / static_cast<double>(std::max<int64_t>(s.steps, 1)));
  s.lr_A = r::kLrARef * std::pow(ratio, r::kAlphaA);
  s.lr_V = r::kLrVRef * std::pow(ratio, r::kAlphaV);
  return s;
}

}  // namespace moesq::compress
