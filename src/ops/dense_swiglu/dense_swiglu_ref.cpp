// CPU twin of ops::dense_swiglu (dense_swiglu.h).
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "ops/dense_swiglu/dense_swiglu.h"

namespace moesq::ops {

void dense_swiglu_check(const DenseSwigluArgs& a) {
  MOESQ_CHECK(a.T >= 0 && a.I >= 1, "dense_swiglu: T=", a.T, " I=", a.I);
  MOESQ_CHECK(a.ld >= 2 * a.I + (a.gated ? 1 : 0), "dense_swiglu: row stride ", a.ld, " < ",
              2 * a.I + (a.gated ? 1 : 0), " (gate, up", a.gated ? ", gate logit)" : ")");
  MOESQ_CHECK(a.T == 0 || (a.gu && a.a), "dense_swiglu: gu and a are required");
}

void dense_swiglu_ref(const DenseSwigluArgs& a) {
  dense_swiglu_check(a);
  for (int64_t t = 0; t < a.T; ++t) {
    const float* row = a.gu + t * a.ld;
    const float s = a.gated ? 1.0f / (1.0f + std::exp(-row[2 * a.I])) : 1.0f;
    for (int64_t i = 0; i < a.I; ++i) {
      const float g = row[i], u = row[a.I + i];
      float v = g / (1.0f + std::exp(-g)) * u;
      if (a.gated) v = v * s;
      const uint16_t hi = f32_to_bf16(v);
      a.a[t * a.I + i] = hi;
      if (a.a_lo) a.a_lo[t * a.I + i] = f32_to_bf16(v - bf16_to_f32(hi));
    }
  }
}

}  // namespace moesq::ops
