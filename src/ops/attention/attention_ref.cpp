// CPU twin of ops::attention (attention.h): per (token, head), chunks of kAttnChunk keys by absolute
// key index, each chunk's (max, Σ exp, Σ exp·v) in fp32, merged in ascending chunk order with the
// kernel's merge formula; a sliding window masks the keys before p − window + 1 (chunks wholly before
// it skipped), a sink is folded into the denominator after the last chunk. fp32 q (the kernel: bf16
// hi + lo), std::exp (the kernel: __expf).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/attention/attention.h"

namespace moesq::ops {

namespace {
int group_of(const AttentionArgs& a) { return a.nh / a.nkv; }
}  // namespace

void attention_check(const AttentionArgs& a) {
  MOESQ_CHECK(a.T >= 0 && a.nh > 0 && a.nkv > 0 && a.nh % a.nkv == 0, "attention: bad heads nh=", a.nh,
              " nkv=", a.nkv);
  const int g = group_of(a);
  MOESQ_CHECK(g == 1 || g == 2 || g == 4 || g == 8 || g == 16, "attention: ", g,
              " query heads per kv head not built (built: 1, 2, 4, 8, 16)");
  MOESQ_CHECK(a.hd == 32 || a.hd == 64 || a.hd == 128 || a.hd == 256, "attention: head_dim ", a.hd,
              " not built (built: 32, 64, 128, 256)");
  MOESQ_CHECK(a.max_len > 0, "attention: max_len must be > 0");
  MOESQ_CHECK(a.window >= 0, "attention: sliding window ", a.window, " must be >= 0 (0 = none)");
  MOESQ_CHECK(!a.gate || (a.gate_head_ld >= a.hd && a.gate_ld >= int64_t{a.nh} * a.gate_head_ld),
              "attention: gate strides ", a.gate_ld, " / ", a.gate_head_ld, " smaller than the heads they hold");
}

size_t attention_partial_floats(int64_t T, int nh, int hd, int64_t max_len) {
  const int64_t chunks = (max_len + kAttnChunk - 1) / kAttnChunk;
  return static_cast<size_t>(std::max<int64_t>(T, 1)) * nh * chunks * (hd + 2);
}

std::vector<int32_t> attention_tiles(const int32_t* tok_slot, const int32_t* tok_pos, int64_t T, int nh, int nkv) {
  MOESQ_CHECK(nh > 0 && nkv > 0 && nh % nkv == 0 && nh / nkv <= kAttnTileRows, "attention_tiles: bad heads nh=", nh,
              " nkv=", nkv);
  const int per_tile = kAttnTileRows / (nh / nkv);
  std::vector<int32_t> tiles;
  for (int64_t t = 0; t < T; ++t) {
    const bool extend = !tiles.empty() && tiles.back() < per_tile && tok_slot[t] == tok_slot[t - 1] &&
                        tok_pos[t] == tok_pos[t - 1] + 1;
    if (extend) {
      ++tiles.back();
    } else {
      tiles.push_back(static_cast<int32_t>(t));
      tiles.push_back(1);
    }
  }
  return tiles;
}

void attention_ref(const AttentionArgs& a) {
  attention_check(a);
  const int group = group_of(a);
  std::vector<float> s(kAttnChunk), oc(a.hd), O(a.hd);
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t pos = a.tok_pos[t], slot = a.tok_slot[t];
    MOESQ_CHECK(pos >= 0 && pos < a.max_len, "attention: token ", t, " position ", pos, " outside [0, ", a.max_len, ")");
    for (int64_t c0 = 0; a.block_table && c0 <= pos; c0 += kKvBlockTokens) {
      const int64_t b = kv_block_of(a.block_table, a.max_len, slot, c0);
      MOESQ_CHECK(b >= 0 && b < a.kv_blocks, "attention: token ", t, " (slot ", slot, ") reads KV block ", b,
                  " for positions from ", c0, ", outside the cache's [0, ", a.kv_blocks, ")");
    }
    for (int h = 0; h < a.nh; ++h) {
      const float* q = a.q + (t * a.nh + h) * a.hd;
      const int kv = h / group;
      float M = -INFINITY, L = 0.0f;
      std::fill(O.begin(), O.end(), 0.0f);
      const int64_t lo = attention_first_key(pos, a.window);  // the first key the row sees
      for (int64_t c0 = lo / kAttnChunk * kAttnChunk; c0 <= pos; c0 += kAttnChunk) {
        const int64_t n = std::min<int64_t>(kAttnChunk, pos + 1 - c0);
        float m = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          if (c0 + j < lo) {  // before the window: masked
            s[j] = -INFINITY;
            continue;
          }
          const uint16_t* k = a.k_cache + (kv_row(a.block_table, a.max_len, slot, c0 + j) * a.nkv + kv) * a.hd;
          float d = 0.0f;
          for (int c = 0; c < a.hd; ++c) d += q[c] * bf16_to_f32(k[c]);
          s[j] = d * a.scale;
          m = std::max(m, s[j]);
        }
        if (m == -INFINITY) continue;  // no key of the chunk in the window (the kernels skip it too)
        float l = 0.0f;
        std::fill(oc.begin(), oc.end(), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          if (c0 + j < lo) continue;
          const float p = std::exp(s[j] - m);
          l += p;
          const uint16_t* v = a.v_cache + (kv_row(a.block_table, a.max_len, slot, c0 + j) * a.nkv + kv) * a.hd;
          for (int c = 0; c < a.hd; ++c) oc[c] += p * bf16_to_f32(v[c]);
        }
        // The kernel's merge (attention.cu merge_weights): first chunk taken as is.
        const float Mn = std::max(M, m);
        const float wa = L == 0.0f ? 0.0f : std::exp(M - Mn), wb = std::exp(m - Mn);
        L = L * wa + l * wb;
        for (int c = 0; c < a.hd; ++c) O[c] = O[c] * wa + oc[c] * wb;
        M = Mn;
      }
      float wa = 1.0f;  // the sink joins the denominator after the last chunk (the kernels' fold_sink)
      if (a.sinks) {
        const float sink = a.sinks[h], Mn = std::max(M, sink);
        wa = std::exp(M - Mn);
        L = L * wa + std::exp(sink - Mn);
      }
      for (int c = 0; c < a.hd; ++c) {
        float o = a.sinks ? (O[c] * wa) / L : O[c] / L;
        if (a.gate) o *= 1.0f / (1.0f + std::exp(-a.gate[t * a.gate_ld + h * a.gate_head_ld + c]));
        a.out[(t * a.nh + h) * a.hd + c] = f32_to_bf16(o);
        if (a.out_lo) a.out_lo[(t * a.nh + h) * a.hd + c] = f32_to_bf16(o - bf16_to_f32(f32_to_bf16(o)));
      }
    }
  }
}

}  // namespace moesq::ops
