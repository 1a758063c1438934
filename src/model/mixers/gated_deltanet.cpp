// Gated DeltaNet mixer (see the header for the equations and the source).
// The non-obvious decision: the fast path keeps S as [dk, dv] per value head and updates it in the
// order transformers' recurrent form does (decay, read kv_mem = Sᵀk, delta = β(v − kv_mem), rank-1
// update, read Sᵀq), so prefill and decode share one code path and state, and the decode step is
// bitwise the T = 1 case of prefill.
#include "model/mixers/gated_deltanet.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/swiglu.h"
#include "core/threads.h"

namespace moesq::model {

namespace {

constexpr float kL2NormEps = 1e-6f;  // transformers l2norm (FLA's use_qk_l2norm_in_kernel)

void check(const GdnShape& s, const GdnWeights& w) {
  const int64_t H = s.hidden, C = s.conv_dim(), nv = s.num_v_heads, Vd = s.value_dim();
  MOESQ_CHECK(s.num_k_heads > 0 && nv % s.num_k_heads == 0 && s.conv_kernel >= 1, "gated_deltanet: nv ", nv,
              " must be a multiple of nk ", s.num_k_heads, ", conv kernel ", s.conv_kernel, " >= 1");
  auto expect = [](const std::vector<float>& v, int64_t n, const char* name) {
    MOESQ_CHECK(static_cast<int64_t>(v.size()) == n, "gated_deltanet: ", name, " has ", v.size(), " values, expected ", n);
  };
  expect(w.in_proj_qkv, C * H, "in_proj_qkv");
  expect(w.in_proj_z, Vd * H, "in_proj_z");
  expect(w.in_proj_b, nv * H, "in_proj_b");
  expect(w.in_proj_a, nv * H, "in_proj_a");
  expect(w.conv1d, C * s.conv_kernel, "conv1d");
  expect(w.dt_bias, nv, "dt_bias");
  expect(w.A_log, nv, "A_log");
  expect(w.norm, s.head_v_dim, "norm");
  expect(w.out_proj, H * Vd, "out_proj");
}

// torch.nn.functional.softplus (β = 1, threshold 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

void l2normalize(float* v, int64_t n) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += v[i] * v[i];
  const float inv = 1.0f / std::sqrt(ss + kL2NormEps);
  for (int64_t i = 0; i < n; ++i) v[i] *= inv;
}

// Gated RMSNorm of one value head o [dv] with gate z [dv], in place (Qwen3NextRMSNormGated).
void gated_rmsnorm(float* o, const float* z, const float* w, int64_t dv, double eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < dv; ++i) ss += static_cast<double>(o[i]) * o[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dv) + eps));
  for (int64_t i = 0; i < dv; ++i) o[i] = w[i] * (o[i] * inv) * silu(z[i]);
}

void linear(const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
              1.0f, x, static_cast<int>(K), W.data(), static_cast<int>(K), 0.0f, y, static_cast<int>(N));
}

void linear_ref(const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * W[n * K + k];
      y[m * N + n] = acc;
    }
}

}  // namespace

void unfuse_qkvz_ba(const GdnShape& s, const std::vector<float>& qkvz, const std::vector<float>& ba, GdnWeights& w) {
  const int64_t H = s.hidden, nk = s.num_k_heads, dk = s.head_k_dim, r = s.num_v_heads / nk, dv = s.head_v_dim;
  const int64_t group = 2 * dk + 2 * r * dv, Kd = s.key_dim(), Vd = s.value_dim();
  MOESQ_CHECK(static_cast<int64_t>(qkvz.size()) == nk * group * H, "in_proj_qkvz has ", qkvz.size(),
              " values, expected [", nk * group, ", ", H, "]");
  MOESQ_CHECK(static_cast<int64_t>(ba.size()) == 2 * s.num_v_heads * H, "in_proj_ba has ", ba.size(),
              " values, expected [", 2 * s.num_v_heads, ", ", H, "]");
  w.in_proj_qkv.assign(s.conv_dim() * H, 0.0f);
  w.in_proj_z.assign(Vd * H, 0.0f);
  w.in_proj_b.assign(s.num_v_heads * H, 0.0f);
  w.in_proj_a.assign(s.num_v_heads * H, 0.0f);
  auto copy_rows = [H](const std::vector<float>& src, int64_t src_row, std::vector<float>& dst, int64_t dst_row,
                       int64_t rows) {
    std::memcpy(&dst[dst_row * H], &src[src_row * H], rows * H * sizeof(float));
  };
  for (int64_t g = 0; g < nk; ++g) {
    const int64_t base = g * group;
    copy_rows(qkvz, base, w.in_proj_qkv, g * dk, dk);                               // q
    copy_rows(qkvz, base + dk, w.in_proj_qkv, Kd + g * dk, dk);                     // k
    copy_rows(qkvz, base + 2 * dk, w.in_proj_qkv, 2 * Kd + g * r * dv, r * dv);     // v
    copy_rows(qkvz, base + 2 * dk + r * dv, w.in_proj_z, g * r * dv, r * dv);       // z
    copy_rows(ba, g * 2 * r, w.in_proj_b, g * r, r);                                // b
    copy_rows(ba, g * 2 * r + r, w.in_proj_a, g * r, r);                            // a
  }
}

GdnState gdn_initial_state(const GdnShape& s) {
  GdnState st;
  st.conv.assign(s.conv_dim() * (s.conv_kernel - 1), 0.0f);
  st.ssm.assign(s.num_v_heads * s.head_k_dim * s.head_v_dim, 0.0f);
  return st;
}

void gated_deltanet_forward(const GdnShape& s, const GdnWeights& w, const float* x, int64_t T, float* y,
                            GdnState* state, int threads) {
  check(s, w);
  if (T == 0) return;
  const int64_t H = s.hidden, C = s.conv_dim(), Kc = s.conv_kernel, nv = s.num_v_heads, dk = s.head_k_dim,
                dv = s.head_v_dim, Kd = s.key_dim(), Vd = s.value_dim(), r = nv / s.num_k_heads;
  GdnState fresh;
  if (!state) {
    fresh = gdn_initial_state(s);
    state = &fresh;
  }
  MOESQ_CHECK(static_cast<int64_t>(state->conv.size()) == C * (Kc - 1) &&
                  static_cast<int64_t>(state->ssm.size()) == nv * dk * dv,
              "gated_deltanet: state does not match the layer shape");
  std::vector<float> pre(T * C), z(T * Vd), b(T * nv), a(T * nv);  // projections [T, ·]
  linear(x, T, H, w.in_proj_qkv, C, pre.data());
  linear(x, T, H, w.in_proj_z, Vd, z.data());
  linear(x, T, H, w.in_proj_b, nv, b.data());
  linear(x, T, H, w.in_proj_a, nv, a.data());
  // Causal depthwise conv + SiLU, the state's Kc−1 inputs as left context; then shift the state.
  std::vector<float> qkv(T * C);  // [T, C]
  std::vector<float> win(Kc - 1 + T);
  for (int64_t c = 0; c < C; ++c) {
    float* st = state->conv.data() + c * (Kc - 1);  // Kc = 1: no state (empty vector, no element to reference)
    std::copy(st, st + Kc - 1, win.begin());
    for (int64_t t = 0; t < T; ++t) win[Kc - 1 + t] = pre[t * C + c];
    const float* wc = &w.conv1d[c * Kc];
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0.0f;
      for (int64_t j = 0; j < Kc; ++j) acc += wc[j] * win[t + j];
      qkv[t * C + c] = silu(acc);
    }
    std::copy(win.end() - (Kc - 1), win.end(), st);
  }
  // Recurrence per value head (heads are independent).
  std::vector<float> o(T * Vd);  // [T, nv·dv]
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  parallel_for(
      nv,
      [&](int64_t h) {
        const int64_t kh = h / r;
        float* S = &state->ssm[h * dk * dv];  // [dk, dv]
        std::vector<float> q(dk), k(dk), kv(dv);
        const float A = std::exp(w.A_log[h]);
        for (int64_t t = 0; t < T; ++t) {
          const float* row = &qkv[t * C];
          std::copy(row + kh * dk, row + (kh + 1) * dk, q.begin());
          std::copy(row + Kd + kh * dk, row + Kd + (kh + 1) * dk, k.begin());
          const float* v = row + 2 * Kd + h * dv;
          l2normalize(q.data(), dk);
          l2normalize(k.data(), dk);
          for (float& e : q) e *= qscale;
          const float alpha = std::exp(-A * softplus(a[t * nv + h] + w.dt_bias[h]));
          const float beta = sigmoid(b[t * nv + h]);
          for (int64_t i = 0; i < dk * dv; ++i) S[i] *= alpha;
          std::fill(kv.begin(), kv.end(), 0.0f);
          for (int64_t i = 0; i < dk; ++i)
            for (int64_t j = 0; j < dv; ++j) kv[j] += S[i * dv + j] * k[i];
          for (int64_t j = 0; j < dv; ++j) kv[j] = (v[j] - kv[j]) * beta;  // delta
          float* out = &o[t * Vd + h * dv];
          std::fill(out, out + dv, 0.0f);
          for (int64_t i = 0; i < dk; ++i)
            for (int64_t j = 0; j < dv; ++j) {
              S[i * dv + j] += k[i] * kv[j];
              out[j] += S[i * dv + j] * q[i];
            }
          gated_rmsnorm(out, &z[t * Vd + h * dv], w.norm.data(), dv, s.eps);
        }
      },
      std::min<int>(threads > 0 ? threads : num_threads(), static_cast<int>(nv)));
  state->tokens += T;
  linear(o.data(), T, Vd, w.out_proj, H, y);
}

void gated_deltanet_forward_ref(const GdnShape& s, const GdnWeights& w, const float* x, int64_t T, float* y) {
  check(s, w);
  const int64_t H = s.hidden, C = s.conv_dim(), Kc = s.conv_kernel, nv = s.num_v_heads, dk = s.head_k_dim,
                dv = s.head_v_dim, Kd = s.key_dim(), Vd = s.value_dim(), r = nv / s.num_k_heads;
  std::vector<float> pre(T * C), z(T * Vd), b(T * nv), a(T * nv), qkv(T * C), o(T * Vd, 0.0f);
  linear_ref(x, T, H, w.in_proj_qkv, C, pre.data());
  linear_ref(x, T, H, w.in_proj_z, Vd, z.data());
  linear_ref(x, T, H, w.in_proj_b, nv, b.data());
  linear_ref(x, T, H, w.in_proj_a, nv, a.data());
  // conv1d(padding = Kc−1) truncated to the first T outputs: out[t] = Σ_j w[j] · pre[t − (Kc−1) + j].
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < Kc; ++j) {
        const int64_t src = t - (Kc - 1) + j;
        if (src >= 0) acc += w.conv1d[c * Kc + j] * pre[src * C + c];
      }
      qkv[t * C + c] = silu(acc);
    }
  std::vector<float> S(dk * dv), q(dk), k(dk), delta(dv);
  for (int64_t h = 0; h < nv; ++h) {
    std::fill(S.begin(), S.end(), 0.0f);
    const int64_t kh = h / r;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < dk; ++i) {
        q[i] = qkv[t * C + kh * dk + i];
        k[i] = qkv[t * C + Kd + kh * dk + i];
      }
      l2normalize(q.data(), dk);
      l2normalize(k.data(), dk);
      for (float& e : q) e /= std::sqrt(static_cast<float>(dk));
      const float g = -std::exp(w.A_log[h]) * softplus(a[t * nv + h] + w.dt_bias[h]);
      const float beta = 1.0f / (1.0f + std::exp(-b[t * nv + h]));
      for (float& e : S) e *= std::exp(g);
      for (int64_t j = 0; j < dv; ++j) {
        float mem = 0.0f;
        for (int64_t i = 0; i < dk; ++i) mem += S[i * dv + j] * k[i];
        delta[j] = (qkv[t * C + 2 * Kd + h * dv + j] - mem) * beta;
      }
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += k[i] * delta[j];
      for (int64_t j = 0; j < dv; ++j) {
        float acc = 0.0f;
        for (int64_t i = 0; i < dk; ++i) acc += S[i * dv + j] * q[i];
        o[t * Vd + h * dv + j] = acc;
      }
      gated_rmsnorm(&o[t * Vd + h * dv], &z[t * Vd + h * dv], w.norm.data(), dv, s.eps);
    }
  }
  linear_ref(o.data(), T, Vd, w.out_proj, H, y);
}

}  // namespace moesq::model
