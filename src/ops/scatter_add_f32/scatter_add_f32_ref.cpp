// CPU twin of the scatter_add_f32 launcher (scatter_add_f32.h).
#include <vector>

#include "core/error.h"
#include "ops/scatter_add_f32/scatter_add_f32.h"

namespace moesq::ops {

void scatter_add_f32_check(const ScatterAddF32Args& a) {
  MOESQ_CHECK(a.m >= 0 && a.C > 0 && a.y_rows >= 0, "scatter_add_f32: bad shape m=", a.m, " C=", a.C,
              " y_rows=", a.y_rows);
  MOESQ_CHECK(a.m == 0 || (a.src && a.w && a.idx && a.y), "scatter_add_f32: null pointer");
}

void scatter_add_f32_ref(const ScatterAddF32Args& a) {
  scatter_add_f32_check(a);
  std::vector<char> seen(static_cast<size_t>(a.y_rows), 0);
  for (int64_t i = 0; i < a.m; ++i) {
    const int64_t r = a.idx[i];
    MOESQ_CHECK(r >= 0 && r < a.y_rows, "scatter_add_f32: index ", r, " of row ", i, " is outside the ", a.y_rows,
                " output rows");
    MOESQ_CHECK(!seen[static_cast<size_t>(r)], "scatter_add_f32: output row ", r, " repeated (row ", i, ")");
    seen[static_cast<size_t>(r)] = 1;
    const float w = a.w[i];
    const float* s = a.src + i * a.C;
    float* y = a.y + r * a.C;
    for (int64_t c = 0; c < a.C; ++c) {
      const float p = w * s[c];  // rounded, then added: no contraction (the build sets no FMA target)
      y[c] = y[c] + p;
    }
  }
}

}  // namespace moesq::ops
