// CPU twin of the causal_attention_f32 launcher (causal_attention_f32.h): the plain two-pass softmax.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/causal_attention_f32/causal_attention_f32.h"

namespace moesq::ops {

void causal_attention_f32_check(const CausalAttentionF32Args& a) {
  MOESQ_CHECK(a.n >= 0 && a.nh > 0 && a.nkv > 0 && a.nh % a.nkv == 0, "causal_attention_f32: bad shape n=", a.n,
              " nh=", a.nh, " nkv=", a.nkv);
  MOESQ_CHECK(a.hd > 0 && a.hd <= 256 && a.hd_v >= 0 && a.hd_v <= 256, "causal_attention_f32: head_dim ", a.hd,
              " / value head_dim ", a.v_dim(), " not supported (1 to 256)");
  MOESQ_CHECK(a.window >= 0, "causal_attention_f32: window ", a.window, " < 0");
  MOESQ_CHECK(a.n == 0 || (a.q && a.k && a.v && a.row_start && a.out), "causal_attention_f32: null pointer");
}

void causal_attention_f32_ref(const CausalAttentionF32Args& a) {
  causal_attention_f32_check(a);
  const int dv = a.v_dim();
  const int64_t qw = static_cast<int64_t>(a.nh) * a.hd, kw = static_cast<int64_t>(a.nkv) * a.hd;
  const int64_t ow = static_cast<int64_t>(a.nh) * dv, vw = static_cast<int64_t>(a.nkv) * dv;
  const int group = a.nh / a.nkv;
  std::vector<float> p;
  for (int64_t t = 0; t < a.n; ++t) {
    const int64_t s0 = a.row_start[t];
    MOESQ_CHECK(s0 >= 0 && s0 <= t && a.row_start[s0] == s0 && (t == 0 || t == s0 || a.row_start[t - 1] == s0),
                "causal_attention_f32: row ", t, " has row_start ", s0, ", not the first row of its sequence");
    const int64_t lo = a.window > 0 ? std::max(s0, t - a.window + 1) : s0;
    p.assign(static_cast<size_t>(t - lo + 1), 0.0f);
    for (int i = 0; i < a.nh; ++i) {
      const float* qt = a.q + t * qw + static_cast<int64_t>(i) * a.hd;
      const int64_t g = i / group;
      float mx = -INFINITY;
      for (int64_t j = lo; j <= t; ++j) {
        const float* kj = a.k + j * kw + g * a.hd;
        float d = 0.0f;
        for (int c = 0; c < a.hd; ++c) d += qt[c] * kj[c];
        p[static_cast<size_t>(j - lo)] = d * a.scale;
        mx = std::max(mx, p[static_cast<size_t>(j - lo)]);
      }
      float sum = 0.0f;
      for (float& x : p) sum += (x = std::exp(x - mx));
      const float inv = 1.0f / sum;
      float* o = a.out + t * ow + static_cast<int64_t>(i) * dv;
      std::fill_n(o, dv, 0.0f);
      for (int64_t j = lo; j <= t; ++j) {
        const float w = p[static_cast<size_t>(j - lo)] * inv;
        const float* vj = a.v + j * vw + g * dv;
        for (int c = 0; c < dv; ++c) o[c] += w * vj[c];
      }
    }
  }
}

}  // namespace moesq::ops
