// CPU twin of the descale_rows launcher (descale_rows.h).
#include "core/error.h"
#include "ops/descale_rows/descale_rows.h"

namespace moesq::ops {

void descale_rows_check(const DescaleRowsArgs& a) {
  MOESQ_CHECK(a.rows >= 0 && a.C > 0, "descale_rows: bad shape rows=", a.rows, " C=", a.C);
  MOESQ_CHECK(a.x && a.row_gamma && a.gamma, "descale_rows: a null pointer");
}

void descale_rows_ref(const DescaleRowsArgs& a) {
  descale_rows_check(a);
  const float g = *a.gamma;
  for (int64_t r = 0; r < a.rows; ++r) {
    const float gr = a.row_gamma[r];
    float* row = a.x + r * a.C;
    for (int64_t c = 0; c < a.C; ++c) row[c] = descale_value(row[c], gr, g);
  }
}

}  // namespace moesq::ops
