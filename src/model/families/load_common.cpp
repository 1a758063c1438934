#include "model/families/load_common.h"

#include "io/tensor_names.h"
#include "io/tensor_names_families.h"

namespace moesq::model::family_load {

namespace names = io::family_names;

std::vector<float> layer_f32(const io::Checkpoint& ckpt, int64_t l, const std::string& rest,
                             const std::vector<int64_t>& shape) {
  return ckpt.get_f32(io::layer_tensor(l, rest), shape);
}

std::vector<float> norm_multiplier(const io::Checkpoint& ckpt, int64_t l, const std::string& rest, int64_t n,
                                   bool zero_centered) {
  std::vector<float> w = l >= 0 ? layer_f32(ckpt, l, rest, {n}) : ckpt.get_f32(rest, {n});
  if (zero_centered)
    for (float& v : w) v = 1.0f + v;
  return w;
}

ExpertWeights swiglu_triple(const io::Checkpoint& ckpt, int64_t l, const std::string& prefix, int64_t I, int64_t H) {
  ExpertWeights w;
  w.gate = layer_f32(ckpt, l, prefix + "gate_proj.weight", {I, H});
  w.up = layer_f32(ckpt, l, prefix + "up_proj.weight", {I, H});
  w.down = layer_f32(ckpt, l, prefix + "down_proj.weight", {H, I});
  return w;
}

void load_whole_model(const io::Checkpoint& ckpt, const io::FamilySpec& f, FamilyModel& m) {
  const int64_t V = f.base.vocab_size, H = f.base.hidden_size;
  m.embed_weight() = ckpt.get_f32(io::kEmbedTokens, {V, H});
  m.final_norm_weight() = norm_multiplier(ckpt, -1, io::kFinalNorm, H, f.zero_centered_norms);
  m.lm_head_weight() = f.base.tie_word_embeddings ? m.embed_weight() : ckpt.get_f32(io::kLmHead, {V, H});
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
