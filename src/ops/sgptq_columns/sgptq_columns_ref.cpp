// CPU twin of the sgptq_columns launcher (sgptq_columns.h): the per-row code of sgptq_row.h, row by row.
#include <cmath>

#include "core/error.h"
#include "ops/sgptq_columns/sgptq_columns.h"
#include "ops/sgptq_columns/sgptq_row.h"

namespace moesq::ops {

void sgptq_columns_check(const SgptqColumnsArgs& a) {
  MOESQ_CHECK(a.N > 0 && a.K > 0 && a.K % 32 == 0, "sgptq_columns: bad shape N=", a.N, " K=", a.K,
              " (K must be a positive multiple of 32)");
  MOESQ_CHECK(a.b0 >= 0 && a.b0 < a.b1 && a.b1 <= a.K && a.b0 % 32 == 0 && a.b1 % 32 == 0, "sgptq_columns: block [",
              a.b0, ", ", a.b1, ") is not a run of whole 32-column scale blocks inside K=", a.K);
  MOESQ_CHECK(a.gptq_from >= 0 && a.gptq_from <= a.K, "sgptq_columns: gptq_from=", a.gptq_from, " outside [0, K]");
  MOESQ_CHECK(a.gamma > 0.0f && std::isfinite(a.gamma), "sgptq_columns: tensor scale ", a.gamma,
              " must be positive and finite");
  MOESQ_CHECK(a.Wt && a.U && a.patterns && a.scale_codes && a.value_codes && a.dense_rounded && a.err && a.row_loss,
              "sgptq_columns: null pointer");
}

void sgptq_columns_ref(const SgptqColumnsArgs& a) {
  sgptq_columns_check(a);
  bool finite = true;
  for (int64_t r = 0; r < a.N; ++r) {
    const sgptq_detail::RowBlock b{a.Wt + r, a.N, a.U, a.K, 0};  // in place, global layouts
    finite = sgptq_detail::sgptq_row(a, r, b) && finite;
  }
  if (!finite && a.nonfinite) *a.nonfinite = 1;
}

}  // namespace moesq::ops
