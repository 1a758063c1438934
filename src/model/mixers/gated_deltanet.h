// Gated DeltaNet linear-attention mixer (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks",
// Eq. 10: S_t = α_t S_{t−1} (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t), as Qwen3-Next and
// Qwen3.5 run it:
//   [q | k | v] = causal depthwise conv1d (kernel Kc, no bias) of in_proj_qkv(x), then SiLU;
//   q, k L2-normalised per head (ε = 1e-6), q · dk^-½; key heads shared by nv/nk value heads;
//   β = σ(in_proj_b x), g = −exp(A_log) · softplus(in_proj_a x + dt_bias), α = exp(g);
//   o = RMSNorm_gated(o, z) = w ⊙ o / rms(o) ⊙ silu(z), z = in_proj_z x;  y = out_proj(o).
// The recurrence runs in fp32 token by token (the plain recurrent form; transformers' chunked
// form is the same sum in another order). GdnState carries the conv window and S across calls, so
// decode is this forward with T = 1 from the state prefill left behind.
#pragma once
#include <cstdint>
#include <vector>

namespace moesq::model {

struct GdnShape {
  int64_t hidden = 0;                          // H
  int64_t num_k_heads = 0, head_k_dim = 0;     // nk, dk
  int64_t num_v_heads = 0, head_v_dim = 0;     // nv, dv (nv % nk == 0)
  int64_t conv_kernel = 0;                     // Kc
  double eps = 1e-6;                           // gated RMSNorm epsilon
  int64_t key_dim() const { return num_k_heads * head_k_dim; }
  int64_t value_dim() const { return num_v_heads * head_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

struct GdnWeights {
  std::vector<float> in_proj_qkv;  // [conv_dim, H]: rows q (nk·dk), k (nk·dk), v (nv·dv), head-major
  std::vector<float> in_proj_z;    // [nv·dv, H]
  std::vector<float> in_proj_b;    // [nv, H]
  std::vector<float> in_proj_a;    // [nv, H]
  std::vector<float> conv1d;       // [conv_dim, Kc]; tap Kc−1 multiplies the current token
  std::vector<float> dt_bias;      // [nv]
  std::vector<float> A_log;        // [nv]
  std::vector<float> norm;         // [dv] gated-RMSNorm weight (used as w, not 1 + w)
  std::vector<float> out_proj;     // [H, nv·dv]
};

// Qwen3-Next's fused projections → the separate Qwen3.5 layout above. in_proj_qkvz [2·key_dim +
// 2·value_dim, H] is grouped by key head: per group (q dk | k dk | v r·dv | z r·dv), r = nv/nk;
// in_proj_ba [2·nv, H] per group (b r | a r) (transformers fix_query_key_value_ordering).
void unfuse_qkvz_ba(const GdnShape& s, const std::vector<float>& qkvz, const std::vector<float>& ba, GdnWeights& w);

struct GdnState {
  std::vector<float> conv;  // [conv_dim, Kc−1] the last Kc−1 conv inputs, oldest first (zeros at start)
  std::vector<float> ssm;   // [nv, dk, dv] S in fp32
  int64_t tokens = 0;       // tokens consumed
};
GdnState gdn_initial_state(const GdnShape& s);

// x [T, H] (input-normed rows) → y [T, H]. With a state: continues from it and leaves it after
// token T−1; without: a fresh sequence. Projections via BLAS; heads in parallel (`threads`).
void gated_deltanet_forward(const GdnShape& s, const GdnWeights& w, const float* x, int64_t T, float* y,
                            GdnState* state = nullptr, int threads = 0);

// Plain-loop twin for a fresh sequence: projections by loops, the conv over the whole sequence
// with zero padding (not through a state), the same recurrence.
void gated_deltanet_forward_ref(const GdnShape& s, const GdnWeights& w, const float* x, int64_t T, float* y);

}  // namespace moesq::model
