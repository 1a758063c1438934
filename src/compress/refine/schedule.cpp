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
  if (fixed_batch <= 0)
    while (s.batch > r::kMinBatch && (train_rows + s.batch - 1) / s.batch < r::kMinStepsPerEpoch) s.batch /= 2;
  s.steps = static_cast<int64_t>(s.epochs) * ((train_rows + s.batch - 1) / s.batch);
  const double ratio = std::max(1.0, r::kStepsRef / static_cast<double>(std::max<int64_t>(s.steps, 1)));
  s.lr_A = r::kLrARef * std::pow(ratio, r::kAlphaA);
  s.lr_V = r::kLrVRef * std::pow(ratio, r::kAlphaV);
  return s;
}

RefineSchedule layer_wide_schedule(int64_t num_sequences, int64_t step_sequences, int epochs) {
  namespace r = schedule_rule;
  RefineSchedule s;
  s.batch = 0;
  s.epochs = epochs;
  if (num_sequences <= 0 || step_sequences <= 0) return s;
  s.steps = static_cast<int64_t>(epochs) * ((num_sequences + step_sequences - 1) / step_sequences);
  const double ratio = std::max(1.0, r::kStepsRef / static_cast<double>(std::max<int64_t>(s.steps, 1)));
  s.lr_A = r::kLrARef * std::pow(ratio, r::kAlphaA);
  s.lr_V = r::kLrVRef * std::pow(ratio, r::kAlphaV);
  return s;
}

int64_t layer_batch(int64_t mean_train_rows) {
  namespace r = schedule_rule;
  if (mean_train_rows <= 0) return 0;
  const double cap = std::min(static_cast<double>(r::kMaxBatch),
                              r::kBatchRef * std::pow(r::kRowsRef / static_cast<double>(mean_train_rows), r::kCapExponent));
  int64_t b = r::kBatchRef;
  while (static_cast<double>(2 * b) <= cap && (mean_train_rows + b - 1) / b >= r::kMaxStepsPerEpoch) b *= 2;
  return b > r::kBatchRef ? b : 0;
}

}  // namespace moesq::compress
