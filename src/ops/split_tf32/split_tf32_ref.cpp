// CPU twin of the split_tf32 launcher (split_tf32.h).
#include "core/error.h"
#include "ops/split_tf32/split_tf32.h"
#include "ops/split_tf32/tf32_round.h"

namespace moesq::ops {

void split_tf32_check(const SplitTf32Args& a) {
  MOESQ_CHECK(a.n >= 0, "split_tf32: n = ", a.n, " < 0");
  MOESQ_CHECK(a.n == 0 || (a.x && a.hi && a.lo), "split_tf32: null pointer");
}

void split_tf32_ref(const SplitTf32Args& a) {
  split_tf32_check(a);
  for (int64_t i = 0; i < a.n; ++i) tf32_split(a.x[i], a.hi[i], a.lo[i]);
}

}  // namespace moesq::ops
