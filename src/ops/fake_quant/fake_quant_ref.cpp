// CPU twin of the fake_quant launcher (fake_quant.h) on the format library's quantizers.
#include <cmath>

#include "core/error.h"
#include "format/nvfp4.h"
#include "ops/fake_quant/fake_quant.h"

namespace moesq::ops {

void fake_quant_check(const FakeQuantArgs& a) {
  MOESQ_CHECK(a.rows >= 0 && a.K > 0, "fake_quant: bad shape rows=", a.rows, " K=", a.K);
  MOESQ_CHECK(a.block == 16 || a.block == 32, "fake_quant: block ", a.block, " must be 16 or 32");
  MOESQ_CHECK(a.K % a.block == 0, "fake_quant: K=", a.K, " is not a multiple of block=", a.block);
  MOESQ_CHECK(a.x, "fake_quant: x is null");
}

void fake_quant_ref(const FakeQuantArgs& a) {
  fake_quant_check(a);
  const int64_t n = a.rows * a.K;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(a.x[i])) {
      if (a.nonfinite) *a.nonfinite = 1;
      return;
    }
  if (a.per_row) {
    for (int64_t r = 0; r < a.rows; ++r) format::quantize_activation_row(a.x + r * a.K, a.K, a.block);
    return;
  }
  const float gamma = format::nvfp4_tensor_scale(format::amax_abs(a.x, n));
  if (a.amax) *a.amax = format::amax_abs(a.x, n);
  if (n) format::nvfp4_fake_quant_blocks(a.x, n, a.block, gamma);
}

}  // namespace moesq::ops
