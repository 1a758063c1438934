// CPU twin of ops::rmsnorm: the kernel's fp64 tree (256 strided partial sums, halved pairwise).
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/rmsnorm/rmsnorm.h"

namespace moesq::ops {

void rmsnorm_ref(const RmsNormArgs& a) {
  MOESQ_CHECK(a.D > 0 && a.n >= 0, "rmsnorm: bad sizes n=", a.n, " D=", a.D);
  MOESQ_CHECK(a.y || a.y_f32, "rmsnorm: no output (y and y_f32 are null)");
  constexpr int kThreads = 256;
  std::vector<double> part(kThreads);
  for (int64_t r = 0; r < a.n; ++r) {
    const float* xr = a.x + r * a.D;
    for (int t = 0; t < kThreads; ++t) {
      double s = 0.0;
      for (int64_t i = t; i < a.D; i += kThreads) s += static_cast<double>(xr[i]) * xr[i];
      part[t] = s;
    }
    for (int h = kThreads / 2; h > 0; h /= 2)
      for (int t = 0; t < h; ++t) part[t] += part[t + h];
    const float inv = static_cast<float>(1.0 / std::sqrt(part[0] / static_cast<double>(a.D) + a.eps));
    for (int64_t i = 0; i < a.D; ++i) {
      const float v = a.w[i] * (xr[i] * inv);
      if (a.y_f32) a.y_f32[r * a.D + i] = v;
      if (!a.y) continue;
      a.y[r * a.D + i] = f32_to_bf16(v);
      if (a.y_lo) a.y_lo[r * a.D + i] = f32_to_bf16(v - bf16_to_f32(a.y[r * a.D + i]));
    }
  }
}

}  // namespace moesq::ops
