// The default refinement schedule rule (compress/refine/schedule.h): the paper's Table-4 values at
// Table-4 scale, the documented values on small data, the large-batch regime of the default
// calibration, monotone rates, explicit batch/epochs kept.
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

TEST(RefineSchedule, LargeBatchRegimeKeepsTheMeasuredSteps) {
  // 65,536 calibration tokens (≈ 7,372 rows): batch 128 and 580 steps, as measured with --batch 128.
  const RefineSchedule s64k = refine_schedule(7372);
  EXPECT_EQ(s64k.batch, 128);  // ceil(7372/64) = 116 >= 64 -> 128: ceil(7372/128) = 58
  EXPECT_EQ(s64k.steps, 580);
  // The default 131,072 tokens (≈ 14,746 rows): batch 256, 580 steps, the rates of the 16k row.
  const RefineSchedule s128k = refine_schedule(14746);
  EXPECT_EQ(s128k.batch, 256);
  EXPECT_EQ(s128k.steps, 580);
  EXPECT_DOUBLE_EQ(s128k.lr_A, refine_schedule(1843).lr_A);
  EXPECT_DOUBLE_EQ(s128k.lr_V, refine_schedule(1843).lr_V);
  // Past 16,384 rows the batch stays at the cap 256 and the steps grow with the rows.
  EXPECT_EQ(refine_schedule(20000).batch, 256);
  EXPECT_EQ(refine_schedule(20000).steps, 790);  // 10 · ceil(20000/256)
  // The cap 64 · sqrt(943,718 / R): 256 up to R_ref/16 = 58,982 rows, 128 up to R_ref/4, then 64.
  EXPECT_EQ(refine_schedule(58000).batch, 256);
  EXPECT_EQ(refine_schedule(60000).batch, 128);
  EXPECT_EQ(refine_schedule(235000).batch, 128);
  EXPECT_EQ(refine_schedule(240000).batch, 64);
  // An epoch of 32..63 steps from 2,048 rows (batch 64) to 256 · 63 rows (batch 256, the cap).
  for (int64_t rows = 2048; rows <= 256 * 63; rows += 97) {
    const RefineSchedule s = refine_schedule(rows);
    const int64_t per_epoch = (rows + s.batch - 1) / s.batch;
    EXPECT_GE(per_epoch, 32) << rows;
    EXPECT_LT(per_epoch, 64) << rows;
  }
}

TEST(RefineSchedule, RatesFallAsStepsGrow) {
  // The rates are a non-increasing function of the steps. (The steps themselves jump down by up
  // to 2× where the batch doubles, e.g. 991 -> 993 rows: batch 16 -> 32, so rows -> rates is not
  // monotone at those boundaries; at batch 64 past the cap's last step, >= 235,930 rows, it is.)
  RefineSchedule prev = refine_schedule(1);
  for (int64_t rows = 2; rows <= 2000000; rows = rows * 5 / 4 + 1) {
    const RefineSchedule s = refine_schedule(rows);
    EXPECT_GE(s.batch, 8);
    EXPECT_LE(s.batch, 256);
    // Above 64 only within the cap (so never above 64 at Table-4 scale).
    if (s.batch > 64) EXPECT_LE(static_cast<double>(s.batch), 64.0 * std::sqrt(943718.0 / static_cast<double>(rows))) << rows;
    EXPECT_GE(s.lr_A, 2.5e-4);
    EXPECT_GE(s.lr_V, 5e-5);
    if (s.steps >= prev.steps) {
      EXPECT_LE(s.lr_A, prev.lr_A) << rows;
      EXPECT_LE(s.lr_V, prev.lr_V) << rows;
    }
    if (rows >= 235930) {  // batch 64 from here on: steps grow with the rows
      EXPECT_EQ(s.batch, 64) << rows;
      if (prev.batch == 64) EXPECT_GE(s.steps, prev.steps) << rows;
    }
    // lr_V is scaled more than lr_A (exponent 0.30 vs 0.15).
    EXPECT_GE(s.lr_V / 5e-5, s.lr_A / 2.5e-4 - 1e-12);
    prev = s;
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
