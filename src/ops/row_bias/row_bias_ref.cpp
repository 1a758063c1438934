// CPU twin of ops::row_bias (row_bias.h) and the checks both sides share.
#include "ops/row_bias/row_bias.h"

#include "core/error.h"

namespace moesq::ops {

void row_bias_check(const RowBiasArgs& a) {
  MOESQ_CHECK(a.rows >= 0 && a.cols >= 0, "row_bias: bad sizes rows=", a.rows, " cols=", a.cols);
  MOESQ_CHECK(a.rows * a.cols == 0 || (a.y && a.bias), "row_bias: y and bias are required");
}

void row_bias_ref(const RowBiasArgs& a) {
  row_bias_check(a);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) a.y[r * a.cols + c] += a.bias[c];
}

}  // namespace moesq::ops
