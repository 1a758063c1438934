// Loader helpers of the family mixers (see the header). Qwen3-Next's fused in_proj_qkvz / in_proj_ba
// are re-laid out at load into Qwen3.5's separate in_proj_qkv / z / b / a (unfuse_qkvz_ba), so one
// Gated DeltaNet runs both.
#include "model/mixers/family_load.h"

#include "io/tensor_names.h"
#include "io/tensor_names_families.h"

namespace moesq::model {

AttentionShape family_attention_shape(const io::FamilySpec& f, int64_t l) {
  const io::ModelSpec& s = f.base;
  AttentionShape a;
  a.hidden = s.hidden_size;
  a.num_heads = s.num_heads;
  a.num_kv_heads = s.num_kv_heads;
  a.head_dim = s.head_dim;
  a.output_gate = f.attn_output_gate;
  a.window = f.layer_mixer.at(l) == io::MixerKind::SlidingAttention ? f.sliding_window : 0;
  a.eps = s.rms_norm_eps;
  a.rope = f.rope;
  return a;
}

GdnShape family_gdn_shape(const io::FamilySpec& f) {
  GdnShape g;
  g.hidden = f.base.hidden_size;
  g.num_k_heads = f.linear_num_key_heads;
  g.head_k_dim = f.linear_key_head_dim;
  g.num_v_heads = f.linear_num_value_heads;
  g.head_v_dim = f.linear_value_head_dim;
  g.conv_kernel = f.linear_conv_kernel;
  g.eps = f.base.rms_norm_eps;
  return g;
}

}  // namespace moesq::model

namespace moesq::model::family_load {

namespace names = io::family_names;

std::vector<float> layer_f32(const io::Checkpoint& ckpt, int64_t l, const std::string& rest,
                             const std::vector<int64_t>& shape) {
  return ckpt.get_f32(io::layer_tensor(l, rest), shape);
}

std::vector<float> norm_multiplier(const io::Checkpoint& ckpt, int64_t l, const std::string& rest, int64_t n,
                                   bool zero_centered) {
  std::vector<float> w = layer_f32(ckpt, l, rest, {n});
  if (zero_centered)
    for (float& v : w) v = 1.0f + v;
  return w;
}

void load_attention_projections(const io::Checkpoint& ckpt, const io::FamilySpec& f, int64_t l, AttentionWeights& w) {
  const io::ModelSpec& s = f.base;
  const int64_t H = s.hidden_size, hd = s.head_dim, qr = s.num_heads * hd * (f.attn_output_gate ? 2 : 1);
  const int64_t kw = s.num_kv_heads * hd, ow = s.num_heads * hd;
  const std::string a = names::kAttn;
  w.q_proj = layer_f32(ckpt, l, a + names::kQProj + ".weight", {qr, H});
  w.k_proj = layer_f32(ckpt, l, a + names::kKProj + ".weight", {kw, H});
  w.v_proj = layer_f32(ckpt, l, a + names::kVProj + ".weight", {kw, H});
  w.o_proj = layer_f32(ckpt, l, a + names::kOProj + ".weight", {H, ow});
  if (s.attention_bias) {
    w.q_bias = layer_f32(ckpt, l, a + names::kQProj + ".bias", {qr});
    w.k_bias = layer_f32(ckpt, l, a + names::kKProj + ".bias", {kw});
    w.v_bias = layer_f32(ckpt, l, a + names::kVProj + ".bias", {kw});
    w.o_bias = layer_f32(ckpt, l, a + names::kOProj + ".bias", {H});
  }
}

void load_gdn(const io::Checkpoint& ckpt, const io::FamilySpec& f, const GdnShape& g, int64_t l, GdnWeights& w) {
  const int64_t H = g.hidden, C = g.conv_dim(), Vd = g.value_dim(), nv = g.num_v_heads;
  if (f.fused_qkvz) {
    const std::vector<float> qkvz = layer_f32(ckpt, l, names::kGdnQkvz, {C + Vd, H});
    const std::vector<float> ba = layer_f32(ckpt, l, names::kGdnBa, {2 * nv, H});
    unfuse_qkvz_ba(g, qkvz, ba, w);
  } else {
    w.in_proj_qkv = layer_f32(ckpt, l, names::kGdnQkv, {C, H});
    w.in_proj_z = layer_f32(ckpt, l, names::kGdnZ, {Vd, H});
    w.in_proj_b = layer_f32(ckpt, l, names::kGdnB, {nv, H});
    w.in_proj_a = layer_f32(ckpt, l, names::kGdnA, {nv, H});
  }
  w.conv1d = layer_f32(ckpt, l, names::kGdnConv, {C, 1, g.conv_kernel});
  w.dt_bias = layer_f32(ckpt, l, names::kGdnDtBias, {nv});
  w.A_log = layer_f32(ckpt, l, names::kGdnALog, {nv});
  w.norm = layer_f32(ckpt, l, names::kGdnNorm, {g.head_v_dim});  // gated norm: plain w
  w.out_proj = layer_f32(ckpt, l, names::kGdnOut, {H, Vd});
}

void load_hybrid_attention(const io::Checkpoint& ckpt, const io::FamilySpec& f, int64_t l, AttentionWeights& w) {
  load_attention_projections(ckpt, f, l, w);
  const int64_t hd = f.base.head_dim;
  w.q_norm = norm_multiplier(ckpt, l, names::kQNorm, hd, f.zero_centered_norms);
  w.k_norm = norm_multiplier(ckpt, l, names::kKNorm, hd, f.zero_centered_norms);
}

}  // namespace moesq::model::family_load
