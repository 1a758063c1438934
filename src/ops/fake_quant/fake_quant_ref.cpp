// CPU twin of the fake_quant launcher (fake_quant.h) on the format library's quantizers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "format/nvfp4.h"
#include "ops/fake_quant/fake_quant.h"

namespace moesq::ops {

void fake_quant_check(const FakeQuantArgs& a) {
  MOESQ_CHECK(a.rows >= 0 && a.K > 0, "fake_quant: bad shape rows=", a.rows, " K=", a.K);
  MOESQ_CHECK(a.block == 16 || a.block == 32, "fake_quant: block ", a.block, " must be 16 or 32");
  MOESQ_CHECK(a.K % a.block == 0, "fake_quant: K=", a.K, " is not a multiple of block=", a.block);
  MOESQ_CHECK(a.x, "fake_quant: x is null");
  MOESQ_CHECK((a.unscaled_bf16 == nullptr) == (a.gamma == nullptr),
              "fake_quant: unscaled_bf16 and gamma are given together or not at all");
  MOESQ_CHECK(!a.amax_given || (!a.per_row && a.amax), "fake_quant: amax_given needs a tensor scale and amax");
  MOESQ_CHECK(a.write_x || (a.unscaled_bf16 && !a.per_row),
              "fake_quant: write_x = false needs a tensor scale and the unscaled_bf16 output");
}

namespace {

// The bf16 bits of v, which must be exact in bf16 (its low 16 bits zero: an unscaled NVFP4 value).
uint16_t exact_bf16_bits(float v) {
  uint32_t u = 0;
  std::memcpy(&u, &v, sizeof u);
  MOESQ_CHECK((u & 0xffffu) == 0, "fake_quant: unscaled value ", v, " is not exact in bf16");
  return static_cast<uint16_t>(u >> 16);
}

void store_bf16(const std::vector<float>& unscaled, uint16_t* out) {
  for (size_t i = 0; i < unscaled.size(); ++i) out[i] = exact_bf16_bits(unscaled[i]);
}

}  // namespace

void fake_quant_ref(const FakeQuantArgs& a) {
  fake_quant_check(a);
  const int64_t n = a.rows * a.K;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(a.x[i])) {
      if (a.nonfinite && !a.amax_given) *a.nonfinite = 1;  // amax_given: the producer flagged it
      return;
    }
  // write_x = false: work on a copy, so x is only read.
  std::vector<float> copy(a.write_x ? 0 : static_cast<size_t>(n));
  if (!a.write_x) {
    std::copy(a.x, a.x + n, copy.begin());
    FakeQuantArgs b = a;
    b.x = copy.data();
    b.write_x = true;
    fake_quant_ref(b);
    return;
  }
  const bool unscaled = a.unscaled_bf16 != nullptr;
  if (a.per_row) {
    std::vector<float> u(unscaled ? static_cast<size_t>(a.K) : 0);
    for (int64_t r = 0; r < a.rows; ++r) {
      format::quantize_activation_row(a.x + r * a.K, a.K, a.block, unscaled ? u.data() : nullptr,
                                      unscaled ? a.gamma + r : nullptr);
      if (unscaled) store_bf16(u, a.unscaled_bf16 + r * a.K);
    }
    return;
  }
  if (a.amax_given)
    MOESQ_CHECK(*a.amax == format::amax_abs(a.x, n), "fake_quant: the given amax ", *a.amax, " is not amax(|x|) = ",
                format::amax_abs(a.x, n));
  const float gamma = format::nvfp4_tensor_scale(format::amax_abs(a.x, n));
  if (a.amax) *a.amax = format::amax_abs(a.x, n);
  if (a.gamma) *a.gamma = gamma;
  std::vector<float> u(unscaled ? static_cast<size_t>(n) : 0);
  if (n) format::nvfp4_fake_quant_blocks(a.x, n, a.block, gamma, unscaled ? u.data() : nullptr);
  if (unscaled) store_bf16(u, a.unscaled_bf16);
}

}  // namespace moesq::ops
