// Built-in GQA attention (model/mixers/attention.h), fp32. Linear layers are OpenBLAS sgemm calls in
// PyTorch layout; the plain-loop twin is the oracle. The non-obvious decision: causal blocking — query
// rows [r0, r0 + m) only need keys [0, r0 + m), so scores and P·V are computed per block of
// kAttnBlockM rows over that prefix (≈ half the FLOPs of a full T × T product at T = 512). A
// sliding-window layer masks the keys before t − window + 1 in the softmax (the scores of the block
// prefix are still computed: simple, and the window layers of these families are rare).
#include "model/mixers/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/threads.h"
#include "model/rope.h"
#include "model/tensor_math.h"

namespace moesq::model {

namespace {

// First key row t sees: 0, or t − window + 1 on a sliding-window layer (window > 0).
int64_t first_key(int64_t t, int64_t window) { return window > 0 ? std::max<int64_t>(0, t - window + 1) : 0; }

// Causal softmax of one score row over s[lo..t] in place (fp32, max-subtracted); the other entries of
// s[0..T) set to 0. lo = first_key(t, window).
void causal_softmax_row(float* s, int64_t lo, int64_t t, int64_t T) {
  float mx = s[lo];
  for (int64_t j = lo + 1; j <= t; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
  for (int64_t j = lo; j <= t; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = lo; j <= t; ++j) s[j] *= inv;
  for (int64_t j = 0; j < lo; ++j) s[j] = 0.0f;
  for (int64_t j = t + 1; j < T; ++j) s[j] = 0.0f;
}

// Query rows per causal attention block (a multiple of the sgemm micro-tile; 64 keeps S in L2).
constexpr int64_t kAttnBlockM = 64;

// q [T, nh·hd], k [T, nkv·hd] in place: biases, q/k RMSNorm (spec.qk_norm), RoPE.
void qk_prologue(const io::ModelSpec& s, const LayerWeights& L, int64_t T, bool bf16_inv_freq,
                 std::vector<float>& q, std::vector<float>& k, std::vector<float>& v) {
  const int64_t hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  const int64_t qw = nh * hd, kw = nkv * hd, half = hd / 2;
  add_bias_rows(q.data(), T, qw, L.q_bias);
  add_bias_rows(k.data(), T, kw, L.k_bias);
  add_bias_rows(v.data(), T, kw, L.v_bias);
  if (s.qk_norm == io::QkNorm::PerHead) {
    rmsnorm_rows(q.data(), T * nh, hd, L.q_norm.data(), s.rms_norm_eps, q.data());
    rmsnorm_rows(k.data(), T * nkv, hd, L.k_norm.data(), s.rms_norm_eps, k.data());
  } else if (s.qk_norm == io::QkNorm::Whole) {  // OlmoeAttention: RMSNorm over q [nh·hd] and k [nkv·hd]
    rmsnorm_rows(q.data(), T, qw, L.q_norm.data(), s.rms_norm_eps, q.data());
    rmsnorm_rows(k.data(), T, kw, L.k_norm.data(), s.rms_norm_eps, k.data());
  }
  std::vector<float> cos_t, sin_t;  // [T, hd/2]
  rope_tables(T, hd, s.rope_theta, cos_t, sin_t, bf16_inv_freq);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < nh; ++i) apply_rope(&q[t * qw + i * hd], hd, &cos_t[t * half], &sin_t[t * half]);
    for (int64_t i = 0; i < nkv; ++i) apply_rope(&k[t * kw + i * hd], hd, &cos_t[t * half], &sin_t[t * half]);
  }
}

}  // namespace

std::vector<float> gqa_attention(const io::ModelSpec& s, const LayerWeights& L, const float* x, int64_t T,
                                 const ForwardOptions& fo) {
  const int64_t H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  const int64_t qw = nh * hd, kw = nkv * hd;
  std::vector<float> q(T * qw), k(T * kw), v(T * kw);  // [T, nh·hd], [T, nkv·hd] ×2
  linear(x, T, H, L.q_proj.data(), qw, q.data());
  linear(x, T, H, L.k_proj.data(), kw, k.data());
  linear(x, T, H, L.v_proj.data(), kw, v.data());
  qk_prologue(s, L, T, fo.rope_bf16_inv_freq, q, k, v);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t group = nh / nkv;
  std::vector<float> attn(T * qw);  // [T, nh·hd]
  parallel_for(
      nh,
      [&](int64_t i) {
        const int64_t kv = i / group;
        // S: [m, r0 + m] scores → probabilities, per-thread scratch reused across calls (a fresh
        // 1 MiB vector per head and layer cost ~10 % of an eval in page faults and memset).
        thread_local std::vector<float> S;
        if (S.size() < static_cast<size_t>(kAttnBlockM * T)) S.resize(kAttnBlockM * T);
        for (int64_t r0 = 0; r0 < T; r0 += kAttnBlockM) {
          const int64_t m = std::min<int64_t>(kAttnBlockM, T - r0), cols = r0 + m;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, cols, hd, scale,
                      q.data() + r0 * qw + i * hd, qw, k.data() + kv * hd, kw, 0.0f, S.data(), cols);
          for (int64_t rr = 0; rr < m; ++rr)
            causal_softmax_row(&S[rr * cols], first_key(r0 + rr, L.attention_window), r0 + rr, cols);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hd, cols, 1.0f, S.data(), cols,
                      v.data() + kv * hd, kw, 0.0f, attn.data() + r0 * qw + i * hd, qw);
        }
      },
      std::min<int>(intra_threads(fo.threads), static_cast<int>(nh)));
  std::vector<float> o(T * H);  // [T, H]
  linear(attn.data(), T, qw, L.o_proj.data(), H, o.data());
  add_bias_rows(o.data(), T, H, L.o_bias);
  return o;
}

std::vector<float> gqa_attention_ref(const io::ModelSpec& s, const LayerWeights& L, const float* x, int64_t T,
                                     const ForwardOptions& fo) {
  const int64_t H = s.hidden_size, hd = s.head_dim, nh = s.num_heads, nkv = s.num_kv_heads;
  const int64_t qw = nh * hd, kw = nkv * hd;
  std::vector<float> q(T * qw), k(T * kw), v(T * kw);
  linear_ref(x, T, H, L.q_proj.data(), qw, q.data());
  linear_ref(x, T, H, L.k_proj.data(), kw, k.data());
  linear_ref(x, T, H, L.v_proj.data(), kw, v.data());
  qk_prologue(s, L, T, fo.rope_bf16_inv_freq, q, k, v);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> attn(T * qw, 0.0f), p(T);
  for (int64_t i = 0; i < nh; ++i) {
    const int64_t kv = i / (nh / nkv);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t lo = first_key(t, L.attention_window);
      for (int64_t j = lo; j <= t; ++j) {
        float d = 0.0f;
        for (int64_t c = 0; c < hd; ++c) d += q[t * qw + i * hd + c] * k[j * kw + kv * hd + c];
        p[j] = d * scale;
      }
      causal_softmax_row(p.data(), lo, t, T);
      for (int64_t j = lo; j <= t; ++j)
        for (int64_t c = 0; c < hd; ++c) attn[t * qw + i * hd + c] += p[j] * v[j * kw + kv * hd + c];
    }
  }
  std::vector<float> o(T * H);
  linear_ref(attn.data(), T, qw, L.o_proj.data(), H, o.data());
  add_bias_rows(o.data(), T, H, L.o_bias);
  return o;
}

}  // namespace moesq::model
