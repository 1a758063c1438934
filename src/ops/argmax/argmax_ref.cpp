// CPU twin of ops::argmax (argmax.h): the first strict maximum in ascending v (= the lowest id of the
// tied maxima, which is what the kernel's strided scan plus lowest-id tree reduction gives).
#include "ops/argmax/argmax.h"

#include <cmath>

#include "core/error.h"

namespace moesq::ops {

void argmax_ref(const ArgmaxArgs& a) {
  MOESQ_CHECK(a.n >= 0 && a.V > 0 && a.V <= INT32_MAX, "argmax: bad sizes n=", a.n, " V=", a.V);
  for (int64_t i = 0; i < a.n; ++i) {
    const float* z = a.logits + i * a.V;
    float best = -INFINITY;
    int32_t best_id = 0;  // no value above -inf: 0, as the kernel
    for (int64_t v = 0; v < a.V; ++v)
      if (z[v] > best) best = z[v], best_id = static_cast<int32_t>(v);
    a.out[i] = best_id;
  }
}

}  // namespace moesq::ops
