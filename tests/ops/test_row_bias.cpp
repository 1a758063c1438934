// CPU twin of ops::row_bias (the o_proj bias of gpt-oss's attention block): y[r, c] += bias[c], every
// row, nothing else touched; empty shapes are fine; bad sizes are errors. GPU: tests/gpu/test_engine_ops.cu.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "ops/row_bias/row_bias.h"

namespace {

TEST(RowBiasRef, AddsTheBiasToEveryRow) {
  const int64_t R = 3, C = 5;
  std::vector<float> y(R * C), bias(C);
  for (int64_t i = 0; i < R * C; ++i) y[i] = 0.25f * static_cast<float>(i);
  for (int64_t c = 0; c < C; ++c) bias[c] = -1.5f + static_cast<float>(c);
  const std::vector<float> y0 = y;
  moesq::ops::RowBiasArgs a;
  a.y = y.data(), a.bias = bias.data(), a.rows = R, a.cols = C;
  moesq::ops::row_bias_ref(a);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(y[r * C + c], y0[r * C + c] + bias[c]) << r << "," << c;
  a.rows = 0, a.y = nullptr;
  EXPECT_NO_THROW(moesq::ops::row_bias_ref(a));
  a.rows = -1;
  EXPECT_THROW(moesq::ops::row_bias_ref(a), moesq::Error);
  a.rows = 2;
  EXPECT_THROW(moesq::ops::row_bias_ref(a), moesq::Error);  // y null with values to add
}

}  // namespace
