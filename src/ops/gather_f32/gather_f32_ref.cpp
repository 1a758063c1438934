// CPU twin of the gather_f32 launcher (gather_f32.h).
#include <algorithm>

#include "core/error.h"
#include "ops/gather_f32/gather_f32.h"

namespace moesq::ops {

void gather_f32_check(const GatherF32Args& a) {
  MOESQ_CHECK(a.src_rows >= 0 && a.C > 0 && a.m >= 0, "gather_f32: bad shape src_rows=", a.src_rows, " C=", a.C,
              " m=", a.m);
  MOESQ_CHECK(a.m == 0 || (a.src && a.idx && a.out), "gather_f32: null pointer");
}

void gather_f32_ref(const GatherF32Args& a) {
  gather_f32_check(a);
  for (int64_t i = 0; i < a.m; ++i) {
    const int64_t r = a.idx[i];
    MOESQ_CHECK(r < a.src_rows, "gather_f32: index ", r, " of row ", i, " is past the ", a.src_rows, " source rows");
    if (r < 0) std::fill_n(a.out + i * a.C, a.C, 0.0f);
    else std::copy_n(a.src + r * a.C, a.C, a.out + i * a.C);
  }
}

}  // namespace moesq::ops
