// The default refinement schedule rule (compress/refine/schedule.h): the paper's Table-4 values at
// Table-4 scale, the documented values on small data, monotone rates, the layer batch of the
// large-batch regime, explicit batch/epochs kept.
#include <gtest/gtest.h>

#include <cmath>

#include "compress/refine/schedule.h"

using moesq::compress::refine_schedule;
using moesq::compress::RefineSchedule;

namespace {

TEST(RefineSchedule, TableFourScaleGivesThePapersValues) {
  // Qwen3-30B-A3B: 8,192 × 2,048 tokens, top-8 of 128 experts, 0.9 train = 943,718 rows per expert.
  const RefineSchedule s = refine_schedule(943718);
  EXPECT_EQ(s.batch, 64);
  EXPECT_EQ(s.epochs, 10);
  EXPECT_EQ(s.steps, 147460);
  EXPECT_DOUBLE_EQ(s.lr_A, 2.5e-4);
  EXPECT_DOUBLE_EQ(s.lr_V, 5e-5);
  // More data than Table 4: the rates stay clamped at the paper's.
  const RefineSchedule big = refine_schedule(10'000'000);
  EXPECT_EQ(big.batch, 64);
  EXPECT_DOUBLE_EQ(big.lr_A, 2.5e-4);
  EXPECT_DOUBLE_EQ(big.lr_V, 5e-5);
}

TEST(RefineSchedule, SmallDataGivesTheDocumentedValues) {
  // The tiny fixture with 16,384 calibration tokens: 16384 · 4 / 32 · 0.9 ≈ 1,843 rows per expert.
  const RefineSchedule s = refine_schedule(1843);
  EXPECT_EQ(s.batch, 32);  // ceil(1843/64) = 29 < 32 -> 32: ceil(1843/32) = 58
  EXPECT_EQ(s.steps, 580);
  EXPECT_NEAR(s.lr_A, 5.74e-4, 0.005e-4);  // 2.5e-4 · (147460/580)^0.15
  EXPECT_NEAR(s.lr_V, 2.63e-4, 0.005e-4);  // 5e-5 · (147460/580)^0.30
  EXPECT_DOUBLE_EQ(s.lr_A, 2.5e-4 * std::pow(147460.0 / 580.0, 0.15));
  // 8,192 tokens (≈ 920 rows): batch 16, again 580 steps.
  EXPECT_EQ(refine_schedule(920).batch, 16);
  EXPECT_EQ(refine_schedule(920).steps, 580);
  // Very few rows: the batch floor 8.
  const RefineSchedule few = refine_schedule(50);
  EXPECT_EQ(few.batch, 8);
  EXPECT_EQ(few.steps, 70);  // 10 · ceil(50/8)
  EXPECT_DOUBLE_EQ(few.lr_V, 5e-5 * std::pow(147460.0 / 70.0, 0.30));
  // No rows: no steps, Table-4 values.
  const RefineSchedule none = refine_schedule(0);
  EXPECT_EQ(none.steps, 0);
  EXPECT_DOUBLE_EQ(none.lr_A, 2.5e-4);
}

TEST(RefineSchedule, RatesFallAsStepsGrow) {
  // The rates are a non-increasing function of the steps. (The steps themselves jump down by up
  // to 2× where the batch doubles, e.g. 991 -> 993 rows: batch 16 -> 32, so rows -> rates is not
  // monotone at those boundaries; at batch 64, >= 1,985 rows, it is.)
  RefineSchedule prev = refine_schedule(1);
  for (int64_t rows = 2; rows <= 200000; rows = rows * 5 / 4 + 1) {
    const RefineSchedule s = refine_schedule(rows);
    EXPECT_GE(s.batch, 8);
    EXPECT_LE(s.batch, 64);
    EXPECT_GE(s.lr_A, 2.5e-4);
    EXPECT_GE(s.lr_V, 5e-5);
    if (s.steps >= prev.steps) {
      EXPECT_LE(s.lr_A, prev.lr_A) << rows;
      EXPECT_LE(s.lr_V, prev.lr_V) << rows;
    }
    if (rows >= 1985) {  // batch 64 from here on: steps grow with the rows
      EXPECT_EQ(s.batch, 64) << rows;
      if (prev.batch == 64) EXPECT_GE(s.steps, prev.steps) << rows;
    }
    // lr_V is scaled more than lr_A (exponent 0.30 vs 0.15).
    EXPECT_GE(s.lr_V / 5e-5, s.lr_A / 2.5e-4 - 1e-12);
    prev = s;
  }
}

TEST(RefineSchedule, LayerBatchOfTheLargeBatchRegime) {
  using moesq::compress::layer_batch;
  // Table-4 scale and above: no layer batch (the cap 64 · (R_ref / R̄)^(2/3) is <= 64).
  EXPECT_EQ(layer_batch(943718), 0);
  EXPECT_EQ(layer_batch(10'000'000), 0);
  // The 16,384-token default of before (R̄ ≈ 1,843) and anything with an epoch of < 64 steps at batch 64.
  EXPECT_EQ(layer_batch(1843), 0);
  EXPECT_EQ(layer_batch(64 * 63), 0);
  EXPECT_EQ(layer_batch(0), 0);
  // 65,536 tokens (R̄ ≈ 7,372): 128, as measured with --batch 128 (580 steps for the mean expert).
  EXPECT_EQ(layer_batch(64 * 63 + 1), 128);
  EXPECT_EQ(layer_batch(7372), 128);
  EXPECT_EQ(refine_schedule(7372, layer_batch(7372)).steps, 580);
  EXPECT_EQ(layer_batch(128 * 63), 128);
  // 131,072 tokens (R̄ ≈ 14,746): 256, as measured with --batch 256: 580 steps, the 16k mean expert's rates.
  EXPECT_EQ(layer_batch(128 * 63 + 1), 256);
  EXPECT_EQ(layer_batch(14746), 256);
  const RefineSchedule s = refine_schedule(14746, layer_batch(14746));
  EXPECT_EQ(s.steps, 580);
  EXPECT_DOUBLE_EQ(s.lr_A, refine_schedule(1843).lr_A);
  EXPECT_DOUBLE_EQ(s.lr_V, refine_schedule(1843).lr_V);
  EXPECT_EQ(layer_batch(256 * 63), 256);
  // The default 262,144 tokens (R̄ ≈ 29,491): 512, as measured with --batch 512, 580 steps, same rates.
  EXPECT_EQ(layer_batch(256 * 63 + 1), 512);
  EXPECT_EQ(layer_batch(29491), 512);
  const RefineSchedule d = refine_schedule(29491, layer_batch(29491));
  EXPECT_EQ(d.steps, 580);
  EXPECT_DOUBLE_EQ(d.lr_A, s.lr_A);
  EXPECT_DOUBLE_EQ(d.lr_V, s.lr_V);
  // The cap: 512 up to R_ref/8^1.5 = 41,706 rows, 256 up to R_ref/8 = 117,964, 128 up to R_ref/2^1.5 = 333,655, then none.
  EXPECT_EQ(layer_batch(41700), 512);
  EXPECT_EQ(layer_batch(41710), 256);
  EXPECT_EQ(layer_batch(117900), 256);
  EXPECT_EQ(layer_batch(118000), 128);
  EXPECT_EQ(layer_batch(333000), 128);
  EXPECT_EQ(layer_batch(334000), 0);
  // Never above the cap, never a value other than 0, 128, 256, 512.
  for (int64_t rows = 1; rows <= 2000000; rows = rows * 9 / 8 + 1) {
    const int64_t b = layer_batch(rows);
    EXPECT_TRUE(b == 0 || b == 128 || b == 256 || b == 512) << rows;
    if (b > 0)
      EXPECT_LE(static_cast<double>(b), 64.0 * std::pow(943718.0 / static_cast<double>(rows), 2.0 / 3.0)) << rows;
    if (b > 0) EXPECT_GE((rows + b / 2 - 1) / (b / 2), 64) << rows;  // the last doubling had an epoch of >= 64 steps
  }
}

TEST(RefineSchedule, ExplicitBatchAndEpochsAreKept) {
  const RefineSchedule s = refine_schedule(1843, /*fixed_batch=*/256, /*fixed_epochs=*/3);
  EXPECT_EQ(s.batch, 256);
  EXPECT_EQ(s.epochs, 3);
  EXPECT_EQ(s.steps, 3 * 8);  // ceil(1843/256) = 8
  EXPECT_DOUBLE_EQ(s.lr_A, 2.5e-4 * std::pow(147460.0 / 24.0, 0.15));
}

}  // namespace

TEST(RefineSchedule, LayerWideStepsAndRates) {
  using namespace moesq::compress;
  // The reference's Qwen3-30B-A3B run: 8,192 sequences, 64 per step, 10 epochs → 1,280 steps.
  RefineSchedule s = layer_wide_schedule(8192, 64, 10);
  EXPECT_EQ(s.steps, 1280);
  EXPECT_EQ(s.batch, 0);
  EXPECT_DOUBLE_EQ(s.lr_A, 2.5e-4 * std::pow(147460.0 / 1280.0, 0.15));
  EXPECT_DOUBLE_EQ(s.lr_V, 5e-5 * std::pow(147460.0 / 1280.0, 0.30));
  // moesq's default calibration: 2,048 sequences → 32 steps per epoch; a partial last step counts.
  EXPECT_EQ(layer_wide_schedule(2048, 64, 10).steps, 320);
  EXPECT_EQ(layer_wide_schedule(2049, 64, 10).steps, 330);
  s = layer_wide_schedule(0, 64, 10);
  EXPECT_EQ(s.steps, 0);
  EXPECT_DOUBLE_EQ(s.lr_A, 2.5e-4);
  // More steps than Table 4's never raise the rates above Table 4's.
  EXPECT_DOUBLE_EQ(layer_wide_schedule(1 << 30, 1, 10).lr_V, 5e-5);
}
