// Loader of the Qwen3-Next (qwen3_next) and Qwen3.5 text (qwen3_5_moe_text) checkpoints into
// FamilyModel. Per layer: Gated DeltaNet (linear_attention) or gated full attention with per-head
// zero-centred q/k norms and partial RoPE; MoE with softmax top-k routing, per-expert SwiGLU
// experts and a σ-gated shared expert (or a dense MLP on Qwen3-Next's mlp_only_layers).
// The non-obvious decision: Qwen3-Next's fused in_proj_qkvz / in_proj_ba are re-laid out at load
// into Qwen3.5's separate in_proj_qkv / z / b / a (unfuse_qkvz_ba), so one mixer runs both.
#include <string>

#include "core/error.h"
#include "io/tensor_names.h"
#include "io/tensor_names_families.h"
#include "model/families/family_model.h"
#include "model/families/load_common.h"

namespace moesq::model {

namespace names = io::family_names;
using family_load::layer_f32;

void load_qwen3_next_family(const io::Checkpoint& ckpt, const io::FamilySpec& f, FamilyModel& m) {
  const io::ModelSpec& s = f.base;
  const int64_t H = s.hidden_size, E = s.num_experts, I = s.moe_intermediate_size;
  family_load::load_whole_model(ckpt, f, m);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    FamilyLayer& L = m.layer(l);
    L.input_norm = family_load::norm_multiplier(ckpt, l, names::kInputNorm, H, true);
    L.post_norm = family_load::norm_multiplier(ckpt, l, names::kPostNorm, H, true);
    if (f.layer_mixer[l] == io::MixerKind::GatedDeltaNet) {
      family_load::load_gdn(ckpt, f, m.gdn_shape(), l, L.gdn);
    } else {
      family_load::load_hybrid_attention(ckpt, f, l, L.attn);
    }
    if (!s.is_moe_layer(l)) {
      L.dense_mlp = family_load::swiglu_triple(ckpt, l, names::kDenseMlp, s.intermediate_size, H);
      continue;
    }
    L.router = layer_f32(ckpt, l, names::kRouter, {E, H});
    L.experts.resize(E);
    for (int64_t e = 0; e < E; ++e) {
      ExpertWeights& W = L.experts[e];
      W.gate = ckpt.get_f32(io::expert_tensor_prefix(l, e, io::ExpertProj::Gate) + io::kWeight, {I, H});
      W.up = ckpt.get_f32(io::expert_tensor_prefix(l, e, io::ExpertProj::Up) + io::kWeight, {I, H});
      W.down = ckpt.get_f32(io::expert_tensor_prefix(l, e, io::ExpertProj::Down) + io::kWeight, {H, I});
    }
    if (f.shared_expert_intermediate_size > 0) {
      L.shared_expert = family_load::swiglu_triple(ckpt, l, names::kSharedExpert, f.shared_expert_intermediate_size, H);
      L.shared_expert_gate = layer_f32(ckpt, l, names::kSharedExpertGate, {1, H});
    }
  }
}

}  // namespace moesq::model
