// Latent-cache decode of multi-head latent attention (see mla.h). The non-obvious decision: the
// absorbed form multiplies q_nope by W_UK once per step ([r_kv] per head) and applies W_UV once to the
// probability-weighted latent, so a step costs O(len · nh · r_kv) with no per-position key or value
// expansion — the reason to cache the latent at all. Plain loops: decode rows are few (T = 1).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/mixers/mla.h"
#include "model/tensor_math.h"

namespace moesq::model {

MlaLatentCache mla_latent_cache(const MlaDims& d, int64_t max_len) {
  MOESQ_CHECK(max_len >= 0 && d.kv_lora_rank > 0 && d.qk_rope_head_dim > 0, "mla: bad latent cache shape (max_len ",
              max_len, ", r_kv ", d.kv_lora_rank, ", rope ", d.qk_rope_head_dim, ")");
  MlaLatentCache c;
  c.max_len = max_len;
  c.latent.assign(max_len * d.kv_lora_rank, 0.0f);
  c.k_pe.assign(max_len * d.qk_rope_head_dim, 0.0f);
  return c;
}

void mla_decode(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T,
                MlaLatentCache& cache, float* out) {
  const int64_t p0 = cache.len, H = d.hidden, nh = d.num_heads, nope = d.qk_nope_head_dim;
  const int64_t rope_d = d.qk_rope_head_dim, dqk = d.qk_head_dim(), dv = d.v_head_dim, r_kv = d.kv_lora_rank;
  MOESQ_CHECK(p0 + T <= cache.max_len, "mla decode: position ", p0 + T, " passes the cache's max length ",
              cache.max_len);
  MOESQ_CHECK(static_cast<int64_t>(cache.latent.size()) == cache.max_len * r_kv &&
                  static_cast<int64_t>(cache.k_pe.size()) == cache.max_len * rope_d,
              "mla decode: the cache was made for other dims");
  if (T == 0) return;
  std::vector<float> q(T * nh * dqk);  // [T, nh, d_qk]
  mla_project(d, w, rope, x, T, p0, q.data(), &cache.latent[p0 * r_kv], &cache.k_pe[p0 * rope_d]);
  cache.len = p0 + T;
  const int64_t kv_w = nope + dv;
  std::vector<float> q_lat(r_kv), o_lat(r_kv), scores(p0 + T);  // [r_kv], [r_kv], [len]
  std::vector<float> attn(T * nh * dv);                           // [T, nh·v]
  for (int64_t t = 0; t < T; ++t) {
    const int64_t len = p0 + t + 1;  // causal: positions 0 .. p0+t
    for (int64_t h = 0; h < nh; ++h) {
      const float* qh = &q[(t * nh + h) * dqk];
      const float* w_uk = &w.kv_b_proj[h * kv_w * r_kv];           // [nope, r_kv]
      const float* w_uv = &w.kv_b_proj[(h * kv_w + nope) * r_kv];  // [v, r_kv]
      std::fill(q_lat.begin(), q_lat.end(), 0.0f);
      for (int64_t i = 0; i < nope; ++i)
        for (int64_t r = 0; r < r_kv; ++r) q_lat[r] += qh[i] * w_uk[i * r_kv + r];
      float mx = -INFINITY;
      for (int64_t s = 0; s < len; ++s) {
        const float* c = &cache.latent[s * r_kv];
        const float* kp = &cache.k_pe[s * rope_d];
        float acc = 0.0f;
        for (int64_t r = 0; r < r_kv; ++r) acc += q_lat[r] * c[r];
        for (int64_t i = 0; i < rope_d; ++i) acc += qh[nope + i] * kp[i];
        scores[s] = acc * d.softmax_scale;
        mx = std::max(mx, scores[s]);
      }
      float sum = 0.0f;
      for (int64_t s = 0; s < len; ++s) sum += (scores[s] = std::exp(scores[s] - mx));
      std::fill(o_lat.begin(), o_lat.end(), 0.0f);
      for (int64_t s = 0; s < len; ++s) {
        const float p = scores[s] / sum;
        const float* c = &cache.latent[s * r_kv];
        for (int64_t r = 0; r < r_kv; ++r) o_lat[r] += p * c[r];
      }
      float* oh = &attn[(t * nh + h) * dv];
      for (int64_t j = 0; j < dv; ++j) {
        float acc = 0.0f;
        for (int64_t r = 0; r < r_kv; ++r) acc += w_uv[j * r_kv + r] * o_lat[r];
        oh[j] = acc;
      }
    }
  }
  linear(attn.data(), T, nh * dv, w.o_proj.data(), H, out);
  add_bias_rows(out, T, H, w.o_bias);
}

}  // namespace moesq::model
