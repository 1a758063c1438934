// CPU tests of ops::weighted_mse_ref (the GPU kernel's twin, tests/gpu/test_refine_ops.cu) against the
// plain definition of Eq. 4's router-weighted loss and its gradient:
//   r = ŷ − y_ref (fp32),  loss_i = w_i · Σ_o r_io² (fp64, column order),  dŷ_io = fp32(2 · w_i · inv_norm) · r_io
// bitwise in that order, within fp32 input rounding of an all-fp64 evaluation, an exact integer case,
// padding rows (w = 0), either output alone, an empty batch and the argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/weighted_mse/weighted_mse.h"
#include "support/expect_error.h"

namespace {

using moesq::ops::WeightedMseArgs;

// r = ŷ − y_ref is rounded once to fp32 (2^-24 relative), so r² carries ~2^-23: an all-fp64 loss agrees
// to a few 2^-23 relative.
constexpr double kFp64LossRelTol = 4.0 * 0x1p-23;

struct Case {
  int64_t rows, H;
  std::vector<float> y, y_ref, w;  // [rows, H], [rows, H], [rows]
  double inv_norm;
};

Case random_case(int64_t rows, int64_t H, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> wd(0.05f, 1.0f);
  Case c{rows, H, std::vector<float>(rows * H), std::vector<float>(rows * H), std::vector<float>(rows), 0.0};
  for (auto& v : c.y) v = nd(g);
  for (auto& v : c.y_ref) v = nd(g);
  double sw = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    c.w[i] = i % 5 == 4 ? 0.0f : wd(g) * wd(g);  // every fifth row a padding row
    sw += c.w[i];
  }
  c.inv_norm = 1.0 / (sw * H);
  return c;
}

struct Out {
  std::vector<float> dy;
  std::vector<double> row_loss;
};

Out run_ref(const Case& c) {
  Out o{std::vector<float>(c.rows * c.H, -1.0f), std::vector<double>(c.rows, -1.0)};
  moesq::ops::weighted_mse_ref({.rows = c.rows, .H = c.H, .y = c.y.data(), .y_ref = c.y_ref.data(), .w = c.w.data(),
                                .inv_norm = c.inv_norm, .dy = o.dy.data(), .row_loss = o.row_loss.data()});
  return o;
}

}  // namespace

TEST(WeightedMse, MatchesPlainDefinitionBitwise) {
  for (const int64_t H : {1, 64, 255, 257, 2048})
    for (const int64_t rows : {1, 7, 33}) {
      const Case c = random_case(rows, H, 10 * H + rows);
      const Out o = run_ref(c);
      double total = 0.0;
      for (int64_t i = 0; i < rows; ++i) {
        double sum = 0.0;
        const float coef = static_cast<float>(2.0 * c.w[i] * c.inv_norm);
        for (int64_t k = 0; k < H; ++k) {
          const float r = c.y[i * H + k] - c.y_ref[i * H + k];
          sum += static_cast<double>(r) * static_cast<double>(r);
          ASSERT_EQ(o.dy[i * H + k], coef * r) << "rows=" << rows << " H=" << H << " row " << i << " col " << k;
        }
        ASSERT_EQ(o.row_loss[i], static_cast<double>(c.w[i]) * sum) << "rows=" << rows << " H=" << H << " row " << i;
        // All-fp64 evaluation: within the fp32 rounding of r.
        double sum64 = 0.0;
        for (int64_t k = 0; k < H; ++k) {
          const double r = static_cast<double>(c.y[i * H + k]) - c.y_ref[i * H + k];
          sum64 += r * r;
        }
        EXPECT_NEAR(o.row_loss[i], c.w[i] * sum64, kFp64LossRelTol * c.w[i] * sum64) << "row " << i;
        total += o.row_loss[i];
      }
      EXPECT_GT(total, 0.0);
    }
}

TEST(WeightedMse, IntegerCaseIsExactAndPaddingRowsAreZero) {
  // ŷ − y_ref ∈ {−2, …, 2}, w ∈ {0, 1, 2}, inv_norm = 1/4: every value is exact in fp32 and fp64.
  const int64_t rows = 3, H = 4;
  Case c{rows, H, {}, {}, {1.0f, 0.0f, 2.0f}, 0.25};
  c.y = {1, 2, 3, 4, 9, 9, 9, 9, 0, 0, 0, 0};
  c.y_ref = {0, 0, 3, 6, 1, 2, 3, 4, 1, -1, 2, -2};
  const Out o = run_ref(c);
  EXPECT_EQ(o.row_loss[0], 1.0 * (1 + 4 + 0 + 4));
  EXPECT_EQ(o.row_loss[1], 0.0);  // padding row: no loss …
  EXPECT_EQ(o.row_loss[2], 2.0 * (1 + 1 + 4 + 4));
  const std::vector<float> want_dy = {0.5f, 1.0f, 0.0f, -1.0f, 0, 0, 0, 0, -1.0f, 1.0f, -2.0f, 2.0f};
  for (int64_t k = 0; k < rows * H; ++k) EXPECT_EQ(o.dy[k], want_dy[k]) << "index " << k;  // … and no gradient
}

TEST(WeightedMse, EitherOutputAloneAndEmptyBatch) {
  const Case c = random_case(9, 96, 5);
  const Out both = run_ref(c);
  std::vector<float> dy(c.rows * c.H, -1.0f);
  moesq::ops::weighted_mse_ref({.rows = c.rows, .H = c.H, .y = c.y.data(), .y_ref = c.y_ref.data(), .w = c.w.data(),
                                .inv_norm = c.inv_norm, .dy = dy.data(), .row_loss = nullptr});
  EXPECT_EQ(dy, both.dy);
  std::vector<double> loss(c.rows, -1.0);
  moesq::ops::weighted_mse_ref({.rows = c.rows, .H = c.H, .y = c.y.data(), .y_ref = c.y_ref.data(), .w = c.w.data(),
                                .inv_norm = c.inv_norm, .dy = nullptr, .row_loss = loss.data()});
  EXPECT_EQ(loss, both.row_loss);
  float dummy = 0.0f;
  EXPECT_NO_THROW(moesq::ops::weighted_mse_ref(
      {.rows = 0, .H = 8, .y = &dummy, .y_ref = &dummy, .w = &dummy, .inv_norm = 1.0, .dy = &dummy, .row_loss = nullptr}));
}

TEST(WeightedMse, ArgumentErrorsNameTheProblem) {
  const Case c = random_case(2, 8, 1);
  std::vector<float> dy(16);
  std::vector<double> loss(2);
  const WeightedMseArgs a{.rows = 2, .H = 8, .y = c.y.data(), .y_ref = c.y_ref.data(), .w = c.w.data(),
                          .inv_norm = c.inv_norm, .dy = dy.data(), .row_loss = loss.data()};
  WeightedMseArgs b = a;
  b.H = 0;
  EXPECT_ERROR_CONTAINING(moesq::ops::weighted_mse_ref(b), "bad shape rows=2 H=0");
  b = a;
  b.rows = -1;
  EXPECT_ERROR_CONTAINING(moesq::ops::weighted_mse_ref(b), "rows=-1");
  b = a;
  b.y_ref = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::weighted_mse_ref(b), "y, y_ref and w are required");
  b = a;
  b.w = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::weighted_mse_ref(b), "y, y_ref and w are required");
  b = a;
  b.dy = nullptr;
  b.row_loss = nullptr;
  EXPECT_ERROR_CONTAINING(moesq::ops::weighted_mse_ref(b), "no output");
}
