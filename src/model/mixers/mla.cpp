// The non-obvious decision: the attention runs on the expanded per-head keys and values (the
// "naive" MLA of transformers), not the absorbed form (q·W_UK against the latent c): the absorbed
// form changes the summation order and only pays off for a KV-cached decode. Both twins share one
// body that takes the linear and attention kernels as function pointers, so they differ only there.
#include "model/mixers/mla.h"

#include <cstring>

#include "core/error.h"
#include "model/mixers/causal_attention.h"
#include "model/tensor_math.h"

namespace moesq::model {

namespace {

void check_size(const std::vector<float>& w, int64_t n, const char* name) {
  MOESQ_CHECK(static_cast<int64_t>(w.size()) == n, "mla: ", name, " has ", w.size(), " values, expected ", n);
}

void check(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, int64_t T) {
  MOESQ_CHECK(d.hidden > 0 && d.num_heads > 0 && d.kv_lora_rank > 0 && d.qk_nope_head_dim >= 0 && d.v_head_dim > 0 &&
                  d.qk_rope_head_dim > 0 && d.qk_rope_head_dim % 2 == 0 && d.q_lora_rank >= 0,
              "mla: bad dims (H ", d.hidden, ", heads ", d.num_heads, ", r_kv ", d.kv_lora_rank, ", rope ",
              d.qk_rope_head_dim, ")");
  const int64_t H = d.hidden, nh = d.num_heads, dqk = d.qk_head_dim(), rope_d = d.qk_rope_head_dim;
  if (d.q_lora_rank > 0) {
    check_size(w.q_a_proj, d.q_lora_rank * H, "q_a_proj");
    check_size(w.q_a_norm, d.q_lora_rank, "q_a_layernorm");
    check_size(w.q_b_proj, nh * dqk * d.q_lora_rank, "q_b_proj");
  } else {
    check_size(w.q_proj, nh * dqk * H, "q_proj");
  }
  check_size(w.kv_a_proj, (d.kv_lora_rank + rope_d) * H, "kv_a_proj_with_mqa");
  check_size(w.kv_a_norm, d.kv_lora_rank, "kv_a_layernorm");
  check_size(w.kv_b_proj, nh * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank, "kv_b_proj");
  check_size(w.o_proj, H * nh * d.v_head_dim, "o_proj");
  if (!w.q_a_bias.empty()) check_size(w.q_a_bias, d.q_lora_rank, "q_a_proj.bias");
  if (!w.kv_a_bias.empty()) check_size(w.kv_a_bias, d.kv_lora_rank + rope_d, "kv_a_proj_with_mqa.bias");
  if (!w.o_bias.empty()) check_size(w.o_bias, H, "o_proj.bias");
  MOESQ_CHECK(static_cast<int64_t>(rope.cos.size()) >= T * rope_d / 2 && rope.sin.size() == rope.cos.size(),
              "mla: RoPE tables hold ", rope.cos.size() / (rope_d / 2), " positions, need ", T);
}

// Rotates the rope part of one head vector in place (de-interleaving the stored pairs first).
void rotate(const MlaDims& d, float* v, const RopeTables& rope, int64_t t) {
  const int64_t half = d.qk_rope_head_dim / 2;
  if (d.rope_interleave) deinterleave_pairs(v, d.qk_rope_head_dim);
  apply_rope(v, d.qk_rope_head_dim, &rope.cos[t * half], &rope.sin[t * half]);
}

using LinearFn = void (*)(const float*, int64_t, int64_t, const float*, int64_t, float*);
using AttentionFn = void (*)(const CausalAttentionDesc&, const float*, const float*, const float*, float*);

// y [M, N] = x [M, K] · W [N, K]ᵀ + b (b empty = none) with the given linear kernel.
void affine(LinearFn lin, const float* x, int64_t M, int64_t K, const std::vector<float>& W, int64_t N, float* y,
            const std::vector<float>& b) {
  lin(x, M, K, W.data(), N, y);
  add_bias_rows(y, M, N, b);
}

void project(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T, int64_t p0,
             LinearFn lin, float* q, float* latent, float* k_pe) {
  const int64_t H = d.hidden, nh = d.num_heads, nope = d.qk_nope_head_dim, rope_d = d.qk_rope_head_dim;
  const int64_t dqk = d.qk_head_dim(), r_kv = d.kv_lora_rank;
  if (d.q_lora_rank > 0) {
    std::vector<float> qa(T * d.q_lora_rank);  // [T, r_q]
    affine(lin, x, T, H, w.q_a_proj, d.q_lora_rank, qa.data(), w.q_a_bias);
    rmsnorm_rows(qa.data(), T, d.q_lora_rank, w.q_a_norm.data(), kMlaLatentNormEps, qa.data());
    lin(qa.data(), T, d.q_lora_rank, w.q_b_proj.data(), nh * dqk, q);
  } else {
    lin(x, T, H, w.q_proj.data(), nh * dqk, q);
  }
  const int64_t ckv_w = r_kv + rope_d;
  std::vector<float> ckv(T * ckv_w);  // [T, r_kv + rope]: latent c, then the shared k_pe
  affine(lin, x, T, H, w.kv_a_proj, ckv_w, ckv.data(), w.kv_a_bias);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(&latent[t * r_kv], &ckv[t * ckv_w], r_kv * sizeof(float));
    std::memcpy(&k_pe[t * rope_d], &ckv[t * ckv_w + r_kv], rope_d * sizeof(float));
    rotate(d, &k_pe[t * rope_d], rope, p0 + t);
    for (int64_t h = 0; h < nh; ++h) rotate(d, &q[(t * nh + h) * dqk + nope], rope, p0 + t);
  }
  rmsnorm_rows(latent, T, r_kv, w.kv_a_norm.data(), kMlaLatentNormEps, latent);
}

void mla_body(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T, float* out,
              int threads, LinearFn lin, AttentionFn attend) {
  check(d, w, rope, T);
  if (T == 0) return;
  const int64_t H = d.hidden, nh = d.num_heads, nope = d.qk_nope_head_dim, rope_d = d.qk_rope_head_dim;
  const int64_t dqk = d.qk_head_dim(), dv = d.v_head_dim, r_kv = d.kv_lora_rank;
  std::vector<float> q(T * nh * dqk);                      // [T, nh, d_qk]
  std::vector<float> c(T * r_kv), k_pe_all(T * rope_d);    // [T, r_kv] normalized latent, [T, rope] k_pe
  project(d, w, rope, x, T, 0, lin, q.data(), c.data(), k_pe_all.data());
  const int64_t kv_w = nope + dv;
  std::vector<float> kv(T * nh * kv_w);  // [T, nh, nope + v]
  lin(c.data(), T, r_kv, w.kv_b_proj.data(), nh * kv_w, kv.data());

  std::vector<float> k(T * nh * dqk), v(T * nh * dv);  // [T, nh, d_qk], [T, nh, v]
  for (int64_t t = 0; t < T; ++t) {
    const float* k_pe = &k_pe_all[t * rope_d];
    for (int64_t h = 0; h < nh; ++h) {
      const float* kvh = &kv[(t * nh + h) * kv_w];
      float* kh = &k[(t * nh + h) * dqk];
      std::memcpy(kh, kvh, nope * sizeof(float));
      std::memcpy(kh + nope, k_pe, rope_d * sizeof(float));
      std::memcpy(&v[(t * nh + h) * dv], kvh + nope, dv * sizeof(float));
    }
  }
  CausalAttentionDesc ad;
  ad.T = T;
  ad.num_heads = nh;
  ad.d_qk = dqk;
  ad.d_v = dv;
  ad.q_stride = ad.k_stride = nh * dqk;
  ad.v_stride = ad.out_stride = nh * dv;
  ad.scale = d.softmax_scale;
  ad.threads = threads;
  std::vector<float> attn(T * nh * dv);  // [T, nh·v]
  attend(ad, q.data(), k.data(), v.data(), attn.data());
  affine(lin, attn.data(), T, nh * dv, w.o_proj, H, out, w.o_bias);
}

}  // namespace

MlaWeights mla_zero_weights(const MlaDims& d, bool attention_bias) {
  const int64_t H = d.hidden, nh = d.num_heads, dqk = d.qk_head_dim(), rope_d = d.qk_rope_head_dim;
  MlaWeights w;
  if (d.q_lora_rank > 0) {
    w.q_a_proj.assign(d.q_lora_rank * H, 0.0f);
    w.q_a_norm.assign(d.q_lora_rank, 0.0f);
    w.q_b_proj.assign(nh * dqk * d.q_lora_rank, 0.0f);
    if (attention_bias) w.q_a_bias.assign(d.q_lora_rank, 0.0f);
  } else {
    w.q_proj.assign(nh * dqk * H, 0.0f);
  }
  w.kv_a_proj.assign((d.kv_lora_rank + rope_d) * H, 0.0f);
  w.kv_a_norm.assign(d.kv_lora_rank, 0.0f);
  w.kv_b_proj.assign(nh * (d.qk_nope_head_dim + d.v_head_dim) * d.kv_lora_rank, 0.0f);
  w.o_proj.assign(H * nh * d.v_head_dim, 0.0f);
  if (attention_bias) {
    w.kv_a_bias.assign(d.kv_lora_rank + rope_d, 0.0f);
    w.o_bias.assign(H, 0.0f);
  }
  return w;
}

void mla_forward(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T, float* out,
                 int threads) {
  mla_body(d, w, rope, x, T, out, threads, linear, causal_attention);
}

void mla_forward_ref(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T,
                     float* out) {
  mla_body(d, w, rope, x, T, out, 1, linear_ref, causal_attention_ref);
}

void mla_project(const MlaDims& d, const MlaWeights& w, const RopeTables& rope, const float* x, int64_t T, int64_t p0,
                 float* q, float* latent, float* k_pe) {
  check(d, w, rope, p0 + T);
  if (T > 0) project(d, w, rope, x, T, p0, linear, q, latent, k_pe);
}

}  // namespace moesq::model
