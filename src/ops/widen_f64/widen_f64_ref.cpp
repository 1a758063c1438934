// CPU twin of the widen_f64 launcher (widen_f64.h).
#include <cmath>

#include "core/error.h"
#include "ops/widen_f64/widen_f64.h"

namespace moesq::ops {

void widen_f64_check(const WidenF64Args& a) {
  MOESQ_CHECK(a.rows >= 0 && a.K > 0, "widen_f64: bad shape rows=", a.rows, " K=", a.K);
  MOESQ_CHECK(a.rows == 0 || (a.x && a.out), "widen_f64: null pointer");
}

void widen_f64_ref(const WidenF64Args& a) {
  widen_f64_check(a);
  for (int64_t t = 0; t < a.rows; ++t) {
    const double s = a.w ? std::sqrt(static_cast<double>(a.w[t])) : 1.0;
    for (int64_t k = 0; k < a.K; ++k) a.out[t * a.K + k] = s * static_cast<double>(a.x[t * a.K + k]);
  }
}

}  // namespace moesq::ops
