// CPU twins of the mla_f32 launchers (mla_f32.h): the loops of model/mixers/mla.cpp's project step and
// its k/v expansion, on packed rows with explicit positions.
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/mla_f32/mla_f32.h"

namespace moesq::ops {

namespace {

// v [rope]: de-interleave the stored pairs (if asked), then rotate by the row's cos/sin [rope/2].
void rotate(float* v, int rope, bool interleave, const float* c, const float* s) {
  const int half = rope / 2;
  float tmp[2 * 256];
  std::memcpy(tmp, v, sizeof(float) * static_cast<size_t>(rope));
  for (int i = 0; i < half; ++i) {
    const float a = interleave ? tmp[2 * i] : tmp[i], b = interleave ? tmp[2 * i + 1] : tmp[half + i];
    const float ac = a * c[i], bs = b * s[i], bc = b * c[i], as = a * s[i];
    v[i] = ac - bs;
    v[half + i] = bc + as;
  }
}

}  // namespace

void mla_split_rope_f32_check(const MlaSplitRopeF32Args& a) {
  MOESQ_CHECK(a.n >= 0 && a.nh > 0 && a.r_kv > 0 && a.nope >= 0 && a.rope > 0 && a.rope % 2 == 0 && a.rope <= 512 &&
                  a.max_len > 0,
              "mla_split_rope_f32: bad dims n=", a.n, " nh=", a.nh, " r_kv=", a.r_kv, " nope=", a.nope, " rope=", a.rope,
              " max_len=", a.max_len, " (rope even, at most 512)");
  MOESQ_CHECK(a.n == 0 || (a.ckv && a.q && a.cos && a.sin && a.tok_pos && a.latent && a.k_pe),
              "mla_split_rope_f32: null pointer");
}

void mla_split_rope_f32_ref(const MlaSplitRopeF32Args& a) {
  mla_split_rope_f32_check(a);
  const int64_t ckv_w = a.r_kv + a.rope, dqk = a.nope + a.rope, half = a.rope / 2;
  for (int64_t t = 0; t < a.n; ++t) {
    const int64_t p = a.tok_pos[t];
    MOESQ_CHECK(p >= 0 && p < a.max_len, "mla_split_rope_f32: row ", t, " has position ", p, ", outside [0, ",
                a.max_len, ")");
    const float* c = a.cos + p * half;
    const float* s = a.sin + p * half;
    std::memcpy(a.latent + t * a.r_kv, a.ckv + t * ckv_w, sizeof(float) * static_cast<size_t>(a.r_kv));
    float* kp = a.k_pe + t * a.rope;
    std::memcpy(kp, a.ckv + t * ckv_w + a.r_kv, sizeof(float) * static_cast<size_t>(a.rope));
    rotate(kp, a.rope, a.interleave, c, s);
    for (int h = 0; h < a.nh; ++h) rotate(a.q + (t * a.nh + h) * dqk + a.nope, a.rope, a.interleave, c, s);
  }
}

void mla_expand_kv_f32_check(const MlaExpandKvF32Args& a) {
  MOESQ_CHECK(a.n >= 0 && a.nh > 0 && a.nope >= 0 && a.rope > 0 && a.v_dim > 0, "mla_expand_kv_f32: bad dims n=", a.n,
              " nh=", a.nh, " nope=", a.nope, " rope=", a.rope, " v=", a.v_dim);
  MOESQ_CHECK(a.n == 0 || (a.kv && a.k_pe && a.k && a.v), "mla_expand_kv_f32: null pointer");
}

void mla_expand_kv_f32_ref(const MlaExpandKvF32Args& a) {
  mla_expand_kv_f32_check(a);
  const int64_t kv_w = a.nope + a.v_dim, dqk = a.nope + a.rope;
  for (int64_t t = 0; t < a.n; ++t)
    for (int64_t h = 0; h < a.nh; ++h) {
      const float* src = a.kv + (t * a.nh + h) * kv_w;
      float* k = a.k + (t * a.nh + h) * dqk;
      std::memcpy(k, src, sizeof(float) * static_cast<size_t>(a.nope));
      std::memcpy(k + a.nope, a.k_pe + t * a.rope, sizeof(float) * static_cast<size_t>(a.rope));
      std::memcpy(a.v + (t * a.nh + h) * a.v_dim, src + a.nope, sizeof(float) * static_cast<size_t>(a.v_dim));
    }
}

}  // namespace moesq::ops
