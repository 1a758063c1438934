// CPU twin of ops::qk_rope: the kernel's per-lane strided fp64 partial sums and xor butterfly.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/qk_rope/qk_rope.h"

namespace moesq::ops {

void qk_rope_check(const QkRopeArgs& a) {
  MOESQ_CHECK(a.T >= 0 && a.nh > 0 && a.nkv > 0 && a.nh % a.nkv == 0, "qk_rope: bad heads nh=", a.nh, " nkv=", a.nkv);
  MOESQ_CHECK(a.hd > 0 && a.hd % 32 == 0 && a.hd <= 256, "qk_rope: head_dim ", a.hd,
              " not supported (a multiple of 32, at most 256)");
  MOESQ_CHECK(!a.q_norm == !a.k_norm, "qk_rope: q_norm and k_norm must be given together (or neither: no norm)");
  MOESQ_CHECK(a.max_len > 0, "qk_rope: max_len must be > 0");
  MOESQ_CHECK(!a.k_out == !a.v_out, "qk_rope: k_out and v_out must be given together");
  MOESQ_CHECK(a.rot >= 0 && a.rot <= a.hd && a.rot % 2 == 0, "qk_rope: rotary dims ", a.rot,
              " not even or not in [0, head_dim ", a.hd, "]");
  MOESQ_CHECK(!a.q_gate || (!a.qkv_bias && !a.whole_qk_norm),
              "qk_rope: the q gate layout goes without q/k/v biases and whole-projection q/k norm");
}

namespace {

// The kernel's RMSNorm scale over x [n] (a head, or a whole q / k projection): lane l sums x[i]² for
// i ≡ l (mod 32), then a butterfly.
float inv_rms(const float* x, int n, double eps) {
  double p[32];
  for (int l = 0; l < 32; ++l) {
    double s = 0.0;
    for (int i = l; i < n; i += 32) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    p[l] = s;
  }
  for (int h = 1; h < 32; h *= 2) {
    double q[32];
    for (int l = 0; l < 32; ++l) q[l] = p[l] + p[l ^ h];
    for (int l = 0; l < 32; ++l) p[l] = q[l];
  }
  return static_cast<float>(1.0 / std::sqrt(p[0] / static_cast<double>(n) + eps));
}

}  // namespace

void qk_rope_ref(const QkRopeArgs& a) {
  qk_rope_check(a);
  const int heads = a.nh + 2 * a.nkv, rot = a.rotary_dims(), half = rot / 2;
  const int64_t width = a.row_width(), qs = a.q_gate ? 2 * a.hd : a.hd;  // a q head's stride in the row
  // Offset of head j in a row: q heads at stride qs, then k and v heads at stride hd.
  const auto head_at = [&](int j) { return j < a.nh ? j * qs : a.nh * qs + (j - a.nh) * a.hd; };
  std::vector<float> v(a.hd), r(a.hd), row(static_cast<size_t>(width));
  for (int64_t t = 0; t < a.T; ++t) {
    for (int64_t i = 0; i < width; ++i)  // the token's q|k|v projection, its biases added
      row[i] = a.qkv_bias ? a.qkv[t * width + i] + a.qkv_bias[i] : a.qkv[t * width + i];
    const int64_t pos = a.tok_pos[t], slot = a.k_out ? 0 : a.tok_slot[t];
    MOESQ_CHECK(pos >= 0 && pos < a.max_len, "qk_rope: token ", t, " position ", pos, " outside [0, ", a.max_len, ")");
    if (a.block_table && !a.k_out) {
      const int64_t b = kv_block_of(a.block_table, a.max_len, slot, pos);
      MOESQ_CHECK(b >= 0 && b < a.kv_blocks, "qk_rope: token ", t, " (slot ", slot, ", position ", pos,
                  ") writes KV block ", b, ", outside the cache's [0, ", a.kv_blocks, ")");
    }
    for (int j = 0; j < heads; ++j) {
      const float* x = row.data() + head_at(j);
      const bool is_q = j < a.nh, is_k = !is_q && j < a.nh + a.nkv;
      const int64_t kv = is_q ? 0 : (is_k ? j - a.nh : j - a.nh - a.nkv);
      const int64_t cache_off = a.k_out ? 0 : (kv_row(a.block_table, a.max_len, slot, pos) * a.nkv + kv) * a.hd;
      const int64_t out_off = (t * a.nkv + kv) * a.hd;
      if (!is_q && !is_k) {
        for (int i = 0; i < a.hd; ++i) {
          if (a.v_out) a.v_out[out_off + i] = x[i];
          else a.v_cache[cache_off + i] = f32_to_bf16(x[i]);
        }
        continue;
      }
      const float* w = is_q ? a.q_norm : a.k_norm;
      if (w) {
        const int j0 = a.whole_qk_norm ? (is_q ? 0 : a.nh) : j;
        const int n = a.whole_qk_norm ? (is_q ? a.nh : a.nkv) * a.hd : a.hd;
        const float inv = inv_rms(row.data() + head_at(j0), n, a.eps);
        const float* wj = w + (a.whole_qk_norm ? (j - j0) * a.hd : 0);
        for (int i = 0; i < a.hd; ++i) v[i] = wj[i] * (x[i] * inv);
      } else {
        for (int i = 0; i < a.hd; ++i) v[i] = x[i];
      }
      const float* c = a.cos + pos * half;
      const float* s = a.sin + pos * half;
      for (int i = 0; i < half; ++i) {
        const float lo = v[i], hi = v[i + half];
        r[i] = lo * c[i] - hi * s[i];
        r[i + half] = hi * c[i] + lo * s[i];
      }
      for (int i = rot; i < a.hd; ++i) r[i] = v[i];  // partial RoPE: the rest pass
      for (int i = 0; i < a.hd; ++i) {
        if (is_q) a.q_out[(t * a.nh + j) * a.hd + i] = r[i];
        else if (a.k_out) a.k_out[out_off + i] = r[i];
        else a.k_cache[cache_off + i] = f32_to_bf16(r[i]);
      }
    }
  }
}

}  // namespace moesq::ops
