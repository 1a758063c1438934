// Attention mixer (see the header). The fast path does the projections and, per head, the score
// block Q Kᵀ and P V as sgemm over all visible keys; masking (causal + window) and the softmax with
// the optional sink are one fp32 pass per row. The non-obvious decision: the sink enters the
// softmax as one more logit (max-subtracted with the rest, its probability dropped), exactly
// transformers' eager gpt-oss attention — not as a bias on the denominator computed separately.
#include "model/mixers/gated_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/swiglu.h"
#include "core/threads.h"
#include "model/rope.h"
#include "model/tensor_math.h"

namespace moesq::model {

namespace {

void check_weights(const AttentionShape& s, const AttentionWeights& w) {
  const int64_t H = s.hidden, kw = s.num_kv_heads * s.head_dim;
  MOESQ_CHECK(s.num_heads > 0 && s.num_kv_heads > 0 && s.num_heads % s.num_kv_heads == 0,
              "attention: heads ", s.num_heads, "/", s.num_kv_heads, " are not a valid GQA split");
  MOESQ_CHECK(s.rope.rotary_dim <= s.head_dim, "attention: rotary_dim ", s.rope.rotary_dim, " > head_dim ", s.head_dim);
  MOESQ_CHECK(static_cast<int64_t>(w.q_proj.size()) == s.q_rows() * H, "attention: q_proj has ", w.q_proj.size(),
              " values, expected ", s.q_rows(), "·", H);
  MOESQ_CHECK(static_cast<int64_t>(w.k_proj.size()) == kw * H && static_cast<int64_t>(w.v_proj.size()) == kw * H,
              "attention: k_proj/v_proj must be [", kw, ", ", H, "]");
  MOESQ_CHECK(static_cast<int64_t>(w.o_proj.size()) == H * s.num_heads * s.head_dim, "attention: o_proj must be [",
              H, ", ", s.num_heads * s.head_dim, "]");
  MOESQ_CHECK(w.sinks.empty() || static_cast<int64_t>(w.sinks.size()) == s.num_heads, "attention: sinks must be [",
              s.num_heads, "]");
}

void linear_bias(const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N,
                 const std::vector<float>& b, float* y) {
  if (M == 0 || N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
              1.0f, x, static_cast<int>(K), W.data(), static_cast<int>(K), 0.0f, y, static_cast<int>(N));
  add_bias_rows(y, M, N, b);
}

void linear_bias_ref(const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N,
                     const std::vector<float>& b, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * W[n * K + k];
      y[m * N + n] = acc + (b.empty() ? 0.0f : b[n]);
    }
}

// q [T, nh·hd], gate [T, nh·hd] (gated only), k, v [T, nkv·hd]: split, q/k norm, RoPE at p0.. .
// Shared by both paths: it is per-element work with one evaluation order.
void prepare_qkv(const AttentionShape& s, const AttentionWeights& w, const std::vector<float>& qfull, int64_t T,
                 int64_t p0, std::vector<float>& q, std::vector<float>& gate, std::vector<float>& k) {
  const int64_t nh = s.num_heads, hd = s.head_dim, qw = nh * hd, kw = s.num_kv_heads * hd;
  if (s.output_gate) {
    q.resize(T * qw);
    gate.resize(T * qw);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const float* src = &qfull[t * 2 * qw + h * 2 * hd];
        std::memcpy(&q[t * qw + h * hd], src, hd * sizeof(float));
        std::memcpy(&gate[t * qw + h * hd], src + hd, hd * sizeof(float));
      }
  } else {
    q = qfull;
  }
  if (!w.q_norm.empty()) rmsnorm_rows(q.data(), T * nh, hd, w.q_norm.data(), s.eps, q.data());
  if (!w.k_norm.empty()) rmsnorm_rows(k.data(), T * s.num_kv_heads, hd, w.k_norm.data(), s.eps, k.data());
  std::vector<float> cos_t, sin_t;  // [T, rd/2]
  rope_tables(T, rope_frequencies(s.rope), cos_t, sin_t, p0);
  const int64_t rd = s.rope.rotary_dim, half = rd / 2;
  for (int64_t t = 0; t < T; ++t) {
    const float *c = &cos_t[t * half], *sn = &sin_t[t * half];
    for (int64_t h = 0; h < nh; ++h) apply_rope(&q[t * qw + h * hd], rd, c, sn);
    for (int64_t h = 0; h < s.num_kv_heads; ++h) apply_rope(&k[t * kw + h * hd], rd, c, sn);
  }
}

// Softmax of scores p[0..n) in place with an optional sink logit (its probability dropped).
void softmax_with_sink(float* p, int64_t n, const float* sink) {
  float mx = sink ? *sink : p[0];
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, p[j]);
  float sum = sink ? std::exp(*sink - mx) : 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
}

// First key visible from absolute position P.
int64_t first_key(const AttentionShape& s, int64_t P) { return s.window > 0 ? std::max<int64_t>(0, P - s.window + 1) : 0; }

void gate_and_project(const AttentionShape& s, const AttentionWeights& w, std::vector<float>& attn,
                      const std::vector<float>& gate, int64_t T, float* y, bool ref) {
  if (s.output_gate)
    for (size_t i = 0; i < attn.size(); ++i) attn[i] *= sigmoid(gate[i]);
  const int64_t qw = s.num_heads * s.head_dim;
  if (ref) linear_bias_ref(attn.data(), T, qw, w.o_proj, s.hidden, w.o_bias, y);
  else linear_bias(attn.data(), T, qw, w.o_proj, s.hidden, w.o_bias, y);
}

}  // namespace

void attention_forward(const AttentionShape& s, const AttentionWeights& w, const float* x, int64_t T, float* y,
                       KvCache* cache, int threads) {
  check_weights(s, w);
  if (T == 0) return;
  const int64_t H = s.hidden, nh = s.num_heads, hd = s.head_dim, qw = nh * hd, kw = s.num_kv_heads * hd;
  const int64_t p0 = cache ? cache->len : 0;
  std::vector<float> qfull(T * s.q_rows()), q, gate, k(T * kw), v(T * kw);
  linear_bias(x, T, H, w.q_proj, s.q_rows(), w.q_bias, qfull.data());
  linear_bias(x, T, H, w.k_proj, kw, w.k_bias, k.data());
  linear_bias(x, T, H, w.v_proj, kw, w.v_bias, v.data());
  prepare_qkv(s, w, qfull, T, p0, q, gate, k);
  KvCache local;
  KvCache& kv = cache ? *cache : local;
  kv.k.insert(kv.k.end(), k.begin(), k.end());
  kv.v.insert(kv.v.end(), v.begin(), v.end());
  kv.len += T;
  const int64_t L = kv.len;  // keys kv.first..L−1 stored; query t sits at position p0 + t
  MOESQ_CHECK(static_cast<int64_t>(kv.k.size()) == (L - kv.first) * kw &&
                  kv.v.size() == kv.k.size(),
              "attention: KV cache holds ", kv.k.size(), " key values, expected ", L - kv.first, "·", kw);
  MOESQ_CHECK(first_key(s, p0) >= kv.first, "attention: position ", p0, " sees key ", first_key(s, p0),
              " but the KV cache starts at ", kv.first);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t group = nh / s.num_kv_heads;
  std::vector<float> attn(T * qw);
  parallel_for(
      nh,
      [&](int64_t h) {
        const int64_t g = h / group;
        const int64_t j0 = first_key(s, p0), cols = L - j0;  // keys any query of this call can see
        const int64_t r0 = j0 - kv.first;                     // their first stored row
        std::vector<float> S(T * cols);                       // [T, cols] scores → probabilities
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, cols, hd, scale, q.data() + h * hd, qw,
                    kv.k.data() + r0 * kw + g * hd, kw, 0.0f, S.data(), cols);
        const float* sink = w.sinks.empty() ? nullptr : &w.sinks[h];
        for (int64_t t = 0; t < T; ++t) {
          const int64_t P = p0 + t, lo = first_key(s, P) - j0, hi = P - j0;  // visible [lo, hi]
          float* row = &S[t * cols];
          std::fill(row, row + lo, 0.0f);
          softmax_with_sink(row + lo, hi - lo + 1, sink);
          std::fill(row + hi + 1, row + cols, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, cols, 1.0f, S.data(), cols,
                    kv.v.data() + r0 * kw + g * hd, kw, 0.0f, attn.data() + h * hd, qw);
      },
      std::min<int>(threads > 0 ? threads : num_threads(), static_cast<int>(nh)));
  gate_and_project(s, w, attn, gate, T, y, /*ref=*/false);
}

void drop_invisible_keys(const AttentionShape& s, KvCache& cache) {
  if (s.window <= 0) return;
  const int64_t keep = first_key(s, cache.len);  // first key the next query sees
  if (keep - cache.first < s.window) return;
  const int64_t kw = s.num_kv_heads * s.head_dim, drop = (keep - cache.first) * kw;
  cache.k.erase(cache.k.begin(), cache.k.begin() + drop);
  cache.v.erase(cache.v.begin(), cache.v.begin() + drop);
  cache.first = keep;
}

void attention_forward_ref(const AttentionShape& s, const AttentionWeights& w, const float* x, int64_t T, float* y) {
  check_weights(s, w);
  const int64_t H = s.hidden, nh = s.num_heads, hd = s.head_dim, qw = nh * hd, kw = s.num_kv_heads * hd;
  std::vector<float> qfull(T * s.q_rows()), q, gate, k(T * kw), v(T * kw);
  linear_bias_ref(x, T, H, w.q_proj, s.q_rows(), w.q_bias, qfull.data());
  linear_bias_ref(x, T, H, w.k_proj, kw, w.k_bias, k.data());
  linear_bias_ref(x, T, H, w.v_proj, kw, w.v_bias, v.data());
  prepare_qkv(s, w, qfull, T, 0, q, gate, k);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> attn(T * qw, 0.0f), p(T);
  for (int64_t h = 0; h < nh; ++h) {
    const int64_t g = h / (nh / s.num_kv_heads);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t lo = first_key(s, t), n = t - lo + 1;
      for (int64_t j = lo; j <= t; ++j) {
        float d = 0.0f;
        for (int64_t c = 0; c < hd; ++c) d += q[t * qw + h * hd + c] * k[j * kw + g * hd + c];
        p[j - lo] = d * scale;
      }
      softmax_with_sink(p.data(), n, w.sinks.empty() ? nullptr : &w.sinks[h]);
      for (int64_t j = lo; j <= t; ++j)
        for (int64_t c = 0; c < hd; ++c) attn[t * qw + h * hd + c] += p[j - lo] * v[j * kw + g * hd + c];
    }
  }
  gate_and_project(s, w, attn, gate, T, y, /*ref=*/true);
}

}  // namespace moesq::model
