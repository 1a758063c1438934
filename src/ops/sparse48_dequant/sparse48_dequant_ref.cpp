// CPU twin of the sparse48_dequant launcher (sparse48_dequant.h): format::sparse48_dequantize, the
// specification of the bits, on the descriptor's host pointers.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "format/nvfp4.h"
#include "ops/sparse48_dequant/sparse48_dequant.h"

namespace moesq::ops {

void sparse48_dequant_check(const Sparse48DequantArgs& a) {
  MOESQ_CHECK(a.N >= 0, "sparse48_dequant: N=", a.N, " must be >= 0");
  MOESQ_CHECK(a.K > 0 && a.K % 32 == 0, "sparse48_dequant: K=", a.K, " must be a positive multiple of 32");
  MOESQ_CHECK(a.N == 0 || (a.values && a.meta && a.scales && a.out),
              "sparse48_dequant: values, meta, scales and out are required");
  MOESQ_CHECK(std::isfinite(a.global_scale) && a.global_scale > 0.0f, "sparse48_dequant: tensor scale ",
              a.global_scale, " must be finite and > 0");
}

void sparse48_dequant_ref(const Sparse48DequantArgs& a) {
  sparse48_dequant_check(a);
  format::Sparse48Tensor t;
  t.N = a.N;
  t.K = a.K;
  const size_t n = static_cast<size_t>(a.N * a.K);
  t.values.assign(a.values, a.values + n / 4);
  t.meta.assign(a.meta, a.meta + n / 16);
  t.scales.assign(a.scales, a.scales + n / 32);
  t.global_scale = a.global_scale;
  format::sparse48_dequantize(t, a.out);
}

}  // namespace moesq::ops
