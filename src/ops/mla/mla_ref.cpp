// CPU twins of the MLA ops (mla.h): the kernels' per-lane strided sums and xor butterflies replayed
// on the host, every fp32 product and sum rounded as the kernel writes it (fma where it calls fmaf).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/mla/mla.h"

namespace moesq::ops {

namespace {

constexpr int kLanes = 32;

// The kernels' RMSNorm scale of x [n]: lane l sums x[i]² in fp64 for i ≡ l (mod 32), then a butterfly.
float inv_rms(const float* x, int64_t n, double eps) {
  double p[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    double s = 0.0;
    for (int64_t i = l; i < n; i += kLanes) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    p[l] = s;
  }
  for (int h = 1; h < kLanes; h *= 2) {
    double q[kLanes];
    for (int l = 0; l < kLanes; ++l) q[l] = p[l] + p[l ^ h];
    std::copy(q, q + kLanes, p);
  }
  return static_cast<float>(1.0 / std::sqrt(p[0] / static_cast<double>(n) + eps));
}

// fp32 butterfly sum of 32 lane values (the kernels' __shfl_xor order: 1, 2, 4, 8, 16).
float butterfly_sum(float* p) {
  for (int h = 1; h < kLanes; h *= 2) {
    float q[kLanes];
    for (int l = 0; l < kLanes; ++l) q[l] = p[l] + p[l ^ h];
    std::copy(q, q + kLanes, p);
  }
  return p[0];
}

// Pair i of the rope dims x [rope] as the rotation sees them (transformers' de-interleave when the
// pairs are stored interleaved): (lo, hi) = (x[2i], x[2i+1]) or (x[i], x[i + rope/2]).
void rope_pair(const float* x, int rope, bool interleave, int i, float& lo, float& hi) {
  lo = interleave ? x[2 * i] : x[i];
  hi = interleave ? x[2 * i + 1] : x[i + rope / 2];
}

void split_hi_lo(float y, uint16_t* hi, uint16_t* lo) {
  *hi = f32_to_bf16(y);
  if (lo) *lo = f32_to_bf16(y - bf16_to_f32(*hi));
}

void check_cache(const MlaCacheArgs& kv, int64_t t, int64_t slot, int64_t pos, const char* op) {
  MOESQ_CHECK(pos >= 0 && pos < kv.max_len, op, ": token ", t, " position ", pos, " outside [0, ", kv.max_len, ")");
  if (!kv.block_table) return;
  for (int64_t c0 = 0; c0 <= pos; c0 += kKvBlockTokens) {
    const int64_t b = kv_block_of(kv.block_table, kv.max_len, slot, c0);
    MOESQ_CHECK(b >= 0 && b < kv.kv_blocks, op, ": token ", t, " (slot ", slot, ", position ", c0,
                ") uses KV block ", b, ", outside the cache's [0, ", kv.kv_blocks, ")");
  }
}

void check_latent_dims(int r_kv, int rope, const char* op) {
  MOESQ_CHECK(r_kv > 0 && r_kv % 32 == 0 && r_kv <= kMlaMaxLatent, op, ": kv_lora_rank ", r_kv,
              " not built (a multiple of 32, at most ", kMlaMaxLatent, ")");
  MOESQ_CHECK(rope > 0 && rope % 2 == 0 && rope <= kMlaMaxRope && (r_kv + rope) % 8 == 0, op,
              ": qk_rope_head_dim ", rope, " not built (even, at most ", kMlaMaxRope,
              ", kv_lora_rank + rope a multiple of 8)");
}

}  // namespace

void mla_prep_check(const MlaPrepArgs& a) {
  check_latent_dims(a.r_kv, a.rope, "mla_prep");
  MOESQ_CHECK(a.T >= 0 && a.r_q >= 0 && a.q_cols >= a.r_q && a.lda >= a.q_cols + a.r_kv + a.rope,
              "mla_prep: bad row layout (lda ", a.lda, ", q_cols ", a.q_cols, ", r_q ", a.r_q, ")");
  MOESQ_CHECK(a.r_q == 0 || (a.q_a_norm && a.qa_out), "mla_prep: a q LoRA needs q_a_norm and qa_out");
  MOESQ_CHECK(a.kv_a_norm && a.cos && a.sin && a.kv.cache && a.kv.max_len > 0, "mla_prep: missing kv_a_norm, RoPE ",
              "tables or cache");
}

void mla_q_check(const MlaQArgs& a) {
  check_latent_dims(a.r_kv, a.rope, "mla_q");
  MOESQ_CHECK(a.T >= 0 && a.nh > 0 && a.nope > 0 && a.nope % 8 == 0 && a.ldq >= int64_t(a.nh) * (a.nope + a.rope),
              "mla_q: bad shape (nh ", a.nh, ", qk_nope_head_dim ", a.nope, " must be a multiple of 8, ldq ", a.ldq, ")");
  MOESQ_CHECK(a.q && a.q_nope && a.q_att && a.cos && a.sin && a.max_len > 0, "mla_q: missing pointers");
}

void mla_attention_check(const MlaAttentionArgs& a) {
  check_latent_dims(a.r_kv, a.rope, "mla_attention");
  MOESQ_CHECK(a.T >= 0 && a.nh > 0, "mla_attention: bad heads ", a.nh);
  MOESQ_CHECK(a.q && a.out && a.kv.cache && a.kv.max_len > 0, "mla_attention: missing pointers");
  MOESQ_CHECK(a.tok_slot && a.tok_pos, "mla_attention: missing tok_slot / tok_pos");
  MOESQ_CHECK(!a.partial || a.partial_ranges >= mla_attention_ranges(a.kv.max_len), "mla_attention: partial_ranges ",
              a.partial_ranges, " < the ", mla_attention_ranges(a.kv.max_len), " key ranges of max_len ", a.kv.max_len);
}

void mla_heads_to_rows_check(const MlaHeadsToRowsArgs& a) {
  MOESQ_CHECK(a.T >= 0 && a.nh > 0 && a.v > 0 && a.x && a.y, "mla_heads_to_rows: bad shape (nh ", a.nh, ", v ", a.v,
              ") or missing pointers");
}

int64_t mla_attention_ranges(int64_t max_len) {
  const int64_t keys = static_cast<int64_t>(kMlaRangeChunks) * kKvBlockTokens;
  return (max_len + keys - 1) / keys;
}

size_t mla_attention_partial_floats(int64_t T, int nh, int r_kv, int64_t ranges) {
  return static_cast<size_t>(std::max<int64_t>(T, 1)) * nh * std::max<int64_t>(ranges, 1) * (r_kv + 2);
}

size_t mla_attention_smem_bytes(int r_kv, int rope) {
  const size_t D = static_cast<size_t>(r_kv + rope);
  return (kMlaHeadsPerCta * kKvBlockTokens + 2 * kMlaHeadsPerCta) * sizeof(float) + kKvBlockTokens * D * sizeof(uint16_t);
}

void mla_prep_ref(const MlaPrepArgs& a) {
  mla_prep_check(a);
  const int D = a.r_kv + a.rope, half = a.rope / 2;
  for (int64_t t = 0; t < a.T; ++t) {
    const float* row = a.a + t * a.lda;
    if (a.r_q > 0) {
      const float inv = inv_rms(row, a.r_q, a.eps);
      for (int i = 0; i < a.r_q; ++i)
        split_hi_lo(a.q_a_norm[i] * (row[i] * inv), &a.qa_out[t * a.r_q + i], a.qa_out_lo ? &a.qa_out_lo[t * a.r_q + i] : nullptr);
    }
    const int64_t slot = a.tok_slot[t], pos = a.tok_pos[t];
    check_cache(a.kv, t, slot, pos, "mla_prep");
    uint16_t* dst = a.kv.cache + kv_row(a.kv.block_table, a.kv.max_len, slot, pos) * D;
    const float* c = row + a.q_cols;
    const float inv = inv_rms(c, a.r_kv, a.eps);
    for (int i = 0; i < a.r_kv; ++i) dst[i] = f32_to_bf16(a.kv_a_norm[i] * (c[i] * inv));
    const float* kp = c + a.r_kv;
    const float* cs = a.cos + pos * half;
    const float* sn = a.sin + pos * half;
    for (int i = 0; i < half; ++i) {
      float lo, hi;
      rope_pair(kp, a.rope, a.rope_interleave, i, lo, hi);
      dst[a.r_kv + i] = f32_to_bf16(lo * cs[i] - hi * sn[i]);
      dst[a.r_kv + half + i] = f32_to_bf16(hi * cs[i] + lo * sn[i]);
    }
  }
}

void mla_q_ref(const MlaQArgs& a) {
  mla_q_check(a);
  const int dqk = a.nope + a.rope, D = a.r_kv + a.rope, half = a.rope / 2;
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t pos = a.tok_pos[t];
    MOESQ_CHECK(pos >= 0 && pos < a.max_len, "mla_q: token ", t, " position ", pos, " outside [0, ", a.max_len, ")");
    for (int h = 0; h < a.nh; ++h) {
      const float* x = a.q + t * a.ldq + static_cast<int64_t>(h) * dqk;
      const int64_t o = (static_cast<int64_t>(h) * a.T + t) * a.nope;
      for (int i = 0; i < a.nope; ++i) split_hi_lo(x[i], &a.q_nope[o + i], a.q_nope_lo ? &a.q_nope_lo[o + i] : nullptr);
      float* qa = a.q_att + (static_cast<int64_t>(h) * a.T + t) * D + a.r_kv;
      const float* cs = a.cos + pos * half;
      const float* sn = a.sin + pos * half;
      for (int i = 0; i < half; ++i) {
        float lo, hi;
        rope_pair(x + a.nope, a.rope, a.rope_interleave, i, lo, hi);
        qa[i] = lo * cs[i] - hi * sn[i];
        qa[half + i] = hi * cs[i] + lo * sn[i];
      }
    }
  }
}

void mla_attention_ref(const MlaAttentionArgs& a) {
  mla_attention_check(a);
  const int D = a.r_kv + a.rope;
  std::vector<float> s(kKvBlockTokens), p(kKvBlockTokens), o(a.r_kv), oc(a.r_kv), orng(a.r_kv);
  // (m, l, o) ← merged with a partial (the kernels' merge; ascending order from (−∞, 0, 0)).
  const auto merge = [&](float& m_, float& l_, std::vector<float>& o_, float mc, float lc, const std::vector<float>& oc_) {
    const float m_new = std::max(m_, mc);
    const float alpha = std::exp(m_ - m_new), beta = std::exp(mc - m_new);
    l_ = l_ * alpha + lc * beta;
    for (int d = 0; d < a.r_kv; ++d) o_[d] = o_[d] * alpha + oc_[d] * beta;
    m_ = m_new;
  };
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t slot = a.tok_slot[t], pos = a.tok_pos[t];
    check_cache(a.kv, t, slot, pos, "mla_attention");
    for (int h = 0; h < a.nh; ++h) {
      const float* q = a.q + (static_cast<int64_t>(h) * a.T + t) * D;
      float m = -INFINITY, l = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      const int64_t range_keys = static_cast<int64_t>(kMlaRangeChunks) * kKvBlockTokens;
      for (int64_t r0 = 0; r0 <= pos; r0 += range_keys) {  // key ranges, then their chunks
        float mr = -INFINITY, lr = 0.0f;
        std::fill(orng.begin(), orng.end(), 0.0f);
        for (int64_t k0 = r0; k0 <= pos && k0 < r0 + range_keys; k0 += kKvBlockTokens) {
          const int nk = static_cast<int>(std::min<int64_t>(kKvBlockTokens, pos + 1 - k0));
          const uint16_t* rows = a.kv.cache + kv_row(a.kv.block_table, a.kv.max_len, slot, k0) * D;
          for (int j = 0; j < nk; ++j) {  // score: lane l sums d ≡ l (mod 32) by fma, then the butterfly
            float lane[kLanes];
            for (int l32 = 0; l32 < kLanes; ++l32) {
              float acc = 0.0f;
              for (int d = l32; d < D; d += kLanes) acc = std::fma(q[d], bf16_to_f32(rows[j * D + d]), acc);
              lane[l32] = acc;
            }
            s[j] = butterfly_sum(lane) * a.scale;
          }
          float mc = -INFINITY;
          for (int j = 0; j < nk; ++j) mc = std::max(mc, s[j]);
          float lane[kLanes];
          for (int l32 = 0; l32 < kLanes; ++l32) {  // lane l holds keys l and l + 32
            const float p0 = l32 < nk ? std::exp(s[l32] - mc) : 0.0f;
            const float p1 = l32 + 32 < nk ? std::exp(s[l32 + 32] - mc) : 0.0f;
            if (l32 < nk) p[l32] = p0;
            if (l32 + 32 < nk) p[l32 + 32] = p1;
            lane[l32] = p0 + p1;
          }
          const float lc = butterfly_sum(lane);
          std::fill(oc.begin(), oc.end(), 0.0f);
          for (int j = 0; j < nk; ++j)
            for (int d = 0; d < a.r_kv; ++d) oc[d] = std::fma(p[j], bf16_to_f32(rows[j * D + d]), oc[d]);
          merge(mr, lr, orng, mc, lc, oc);
        }
        merge(m, l, o, mr, lr, orng);
      }
      const int64_t off = (static_cast<int64_t>(h) * a.T + t) * a.r_kv;
      for (int d = 0; d < a.r_kv; ++d) split_hi_lo(o[d] / l, &a.out[off + d], a.out_lo ? &a.out_lo[off + d] : nullptr);
    }
  }
}

void mla_heads_to_rows_ref(const MlaHeadsToRowsArgs& a) {
  mla_heads_to_rows_check(a);
  for (int64_t t = 0; t < a.T; ++t)
    for (int h = 0; h < a.nh; ++h)
      for (int j = 0; j < a.v; ++j) {
        const int64_t o = t * a.nh * a.v + static_cast<int64_t>(h) * a.v + j;
        split_hi_lo(a.x[(static_cast<int64_t>(h) * a.T + t) * a.v + j], &a.y[o], a.y_lo ? &a.y_lo[o] : nullptr);
      }
}

}  // namespace moesq::ops
