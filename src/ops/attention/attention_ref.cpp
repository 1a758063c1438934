// CPU twin of ops::attention: per (token, head) online softmax over the kernel's 16 key chunks, merged in order.
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
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t pos = a.tok_pos[t], slot = a.tok_slot[t];
    MOESQ_CHECK(pos >= 0 && pos < a.max_len, "attention: token ", t, " position ", pos, " outside [0, ", a.max_len, ")");
    for (int h = 0; h < a.nh; ++h) {
      const float* q = a.q + (t * a.nh + h) * a.hd;
      const int kv = h / group;
      // The kernel's split: 16 contiguous chunks of ⌈(pos+1)/8⌉ keys, merged in chunk order.
      constexpr int kChunks = 16;
      const int64_t chunk = (pos + kChunks) / kChunks;
      float cm[kChunks], cl[kChunks];
      std::vector<std::vector<float>> co(kChunks, std::vector<float>(a.hd, 0.0f));
      for (int w = 0; w < kChunks; ++w) {
        float m = -INFINITY, l = 0.0f;
        for (int64_t j = w * chunk; j < std::min(pos + 1, (w + 1) * chunk); ++j) {
          const uint16_t* k = a.k_cache + ((slot * a.max_len + j) * a.nkv + kv) * a.hd;
          const uint16_t* v = a.v_cache + ((slot * a.max_len + j) * a.nkv + kv) * a.hd;
          float d = 0.0f;
          for (int c = 0; c < a.hd; ++c) d += q[c] * bf16_to_f32(k[c]);
          const float s = d * a.scale;
          const float m_new = std::max(m, s);
          const float corr = std::exp(m - m_new), p = std::exp(s - m_new);
          l = l * corr + p;
          for (int c = 0; c < a.hd; ++c) co[w][c] = co[w][c] * corr + p * bf16_to_f32(v[c]);
          m = m_new;
        }
        cm[w] = m, cl[w] = l;
      }
      float M = cm[0], L = 0.0f, f[kChunks];
      for (int w = 1; w < kChunks; ++w) M = std::max(M, cm[w]);
      for (int w = 0; w < kChunks; ++w) {
        f[w] = cl[w] > 0.0f ? std::exp(cm[w] - M) : 0.0f;
        L += cl[w] * f[w];
      }
      for (int c = 0; c < a.hd; ++c) {
        float acc = 0.0f;
        for (int w = 0; w < kChunks; ++w) acc += co[w][c] * f[w];
        const float o = acc / L;
        a.out[(t * a.nh + h) * a.hd + c] = f32_to_bf16(o);
        if (a.out_lo) a.out_lo[(t * a.nh + h) * a.hd + c] = f32_to_bf16(o - bf16_to_f32(f32_to_bf16(o)));
      }
    }
  }
}

}  // namespace moesq::ops
