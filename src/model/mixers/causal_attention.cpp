// The non-obvious decision: the fast path computes scores only for the causal prefix of each block
// of kBlockM query rows (≈ half the FLOPs of a full T × T product) and keeps the score block in a
// per-thread scratch buffer reused across calls; heads run in parallel and write disjoint columns,
// so the result does not depend on the thread count.
#include "model/mixers/causal_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/threads.h"

namespace moesq::model {

namespace {

constexpr int64_t kBlockM = 64;  // query rows per score block (a multiple of the sgemm micro-tile)

// Row s[0..t] → softmax in place (fp32, max subtracted); s[t+1..n) = 0.
void masked_softmax_row(float* s, int64_t t, int64_t n) {
  float mx = s[0];
  for (int64_t j = 1; j <= t; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j <= t; ++j) sum += (s[j] = std::exp(s[j] - mx));
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j <= t; ++j) s[j] *= inv;
  std::fill(s + t + 1, s + n, 0.0f);
}

void check(const CausalAttentionDesc& d) {
  MOESQ_CHECK(d.T >= 0 && d.num_heads > 0 && d.d_qk > 0 && d.d_v > 0, "causal_attention: T = ", d.T, ", heads = ",
              d.num_heads, ", d_qk = ", d.d_qk, ", d_v = ", d.d_v, " (need T >= 0, the rest > 0)");
  MOESQ_CHECK(d.q_stride >= d.num_heads * d.d_qk && d.k_stride >= d.num_heads * d.d_qk &&
                  d.v_stride >= d.num_heads * d.d_v && d.out_stride >= d.num_heads * d.d_v,
              "causal_attention: a row stride is smaller than heads × head width");
}

}  // namespace

void causal_attention(const CausalAttentionDesc& d, const float* q, const float* k, const float* v, float* out) {
  check(d);
  if (d.T == 0) return;
  const int threads = std::min<int>(d.threads > 0 ? d.threads : num_threads(), static_cast<int>(d.num_heads));
  parallel_for(
      d.num_heads,
      [&](int64_t h) {
        thread_local std::vector<float> S;  // [m, r0 + m] scores → probabilities
        if (S.size() < static_cast<size_t>(kBlockM * d.T)) S.resize(kBlockM * d.T);
        for (int64_t r0 = 0; r0 < d.T; r0 += kBlockM) {
          const int64_t m = std::min(kBlockM, d.T - r0), cols = r0 + m;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, cols, d.d_qk, d.scale, q + r0 * d.q_stride + h * d.d_qk,
                      d.q_stride, k + h * d.d_qk, d.k_stride, 0.0f, S.data(), cols);
          for (int64_t rr = 0; rr < m; ++rr) masked_softmax_row(&S[rr * cols], r0 + rr, cols);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d.d_v, cols, 1.0f, S.data(), cols, v + h * d.d_v,
                      d.v_stride, 0.0f, out + r0 * d.out_stride + h * d.d_v, d.out_stride);
        }
      },
      threads);
}

void causal_attention_ref(const CausalAttentionDesc& d, const float* q, const float* k, const float* v, float* out) {
  check(d);
  std::vector<float> p(d.T);
  for (int64_t h = 0; h < d.num_heads; ++h)
    for (int64_t t = 0; t < d.T; ++t) {
      const float* qt = q + t * d.q_stride + h * d.d_qk;
      for (int64_t j = 0; j <= t; ++j) {
        const float* kj = k + j * d.k_stride + h * d.d_qk;
        float dot = 0.0f;
        for (int64_t c = 0; c < d.d_qk; ++c) dot += qt[c] * kj[c];
        p[j] = dot * d.scale;
      }
      masked_softmax_row(p.data(), t, d.T);
      float* ot = out + t * d.out_stride + h * d.d_v;
      std::fill(ot, ot + d.d_v, 0.0f);
      for (int64_t j = 0; j <= t; ++j)
        for (int64_t c = 0; c < d.d_v; ++c) ot[c] += p[j] * v[j * d.v_stride + h * d.d_v + c];
    }
}

}  // namespace moesq::model
