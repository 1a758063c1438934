// CPU twin of ops::attention: per (token, head) online softmax over keys 0..pos in ascending order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/attention/attention.h"

namespace moesq::ops {

void attention_check(const AttentionArgs& a) {
  MOESQ_CHECK(a.T >= 0 && a.nh > 0 && a.nkv > 0 && a.nh % a.nkv == 0, "attention: bad heads nh=", a.nh,
              " nkv=", a.nkv);
  MOESQ_CHECK(a.hd > 0 && a.hd % 32 == 0 && a.hd <= 256, "attention: head_dim ", a.hd,
              " not supported (a multiple of 32, at most 256)");
  MOESQ_CHECK(a.max_len > 0, "attention: max_len must be > 0");
}

void attention_ref(const AttentionArgs& a) {
  attention_check(a);
  const int group = a.nh / a.nkv;
  std::vector<double> acc(a.hd);
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t pos = a.tok_pos[t], slot = a.tok_slot[t];
    MOESQ_CHECK(pos >= 0 && pos < a.max_len, "attention: token ", t, " position ", pos, " outside [0, ", a.max_len, ")");
    for (int h = 0; h < a.nh; ++h) {
      const float* q = a.q + (t * a.nh + h) * a.hd;
      const int kv = h / group;
      float m = -INFINITY, l = 0.0f;
      std::vector<float> o(a.hd, 0.0f);
      for (int64_t j = 0; j <= pos; ++j) {
        const uint16_t* k = a.k_cache + ((slot * a.max_len + j) * a.nkv + kv) * a.hd;
        const uint16_t* v = a.v_cache + ((slot * a.max_len + j) * a.nkv + kv) * a.hd;
        float d = 0.0f;
        for (int c = 0; c < a.hd; ++c) d += q[c] * bf16_to_f32(k[c]);
        const float s = d * a.scale;
        const float m_new = std::max(m, s);
        const float corr = std::exp(m - m_new), p = std::exp(s - m_new);
        l = l * corr + p;
        for (int c = 0; c < a.hd; ++c) o[c] = o[c] * corr + p * bf16_to_f32(v[c]);
        m = m_new;
      }
      for (int c = 0; c < a.hd; ++c) a.out[(t * a.nh + h) * a.hd + c] = f32_to_bf16(o[c] / l);
    }
  }
}

}  // namespace moesq::ops
