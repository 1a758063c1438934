// Loader of gpt-oss checkpoints into FamilyModel: attention with q/k/v/o biases, one sink logit per
// head, sliding-window or full per layer_types, YaRN RoPE; router with bias (top-k of the logits,
// softmax over those k); experts stored FUSED as 3-D tensors (gate_up_proj [E, H, 2I] with gate
// in the even and up in the odd columns, down_proj [E, I, H], biases beside them) and unpacked per
// expert into Linear layout at load (experts/experts.h), so compression sees the usual W [N, K].
#include <string>

#include "core/error.h"
#include "io/tensor_names_families.h"
#include "model/families/family_model.h"
#include "model/families/load_common.h"

namespace moesq::model {

namespace names = io::family_names;
using family_load::layer_f32;

void load_gpt_oss_family(const io::Checkpoint& ckpt, const io::FamilySpec& f, FamilyModel& m) {
  const io::ModelSpec& s = f.base;
  const int64_t H = s.hidden_size, E = s.num_experts, I = s.moe_intermediate_size;
  family_load::load_whole_model(ckpt, f, m);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    FamilyLayer& L = m.layer(l);
    L.input_norm = family_load::norm_multiplier(ckpt, l, names::kInputNorm, H, false);
    L.post_norm = family_load::norm_multiplier(ckpt, l, names::kPostNorm, H, false);
    family_load::load_attention_projections(ckpt, f, l, L.attn);
    L.attn.sinks = layer_f32(ckpt, l, names::kSinks, {s.num_heads});
    L.router = layer_f32(ckpt, l, names::kGptOssRouter, {E, H});
    L.router_bias = layer_f32(ckpt, l, names::kGptOssRouterBias, {E});
    const std::vector<float> gate_up = layer_f32(ckpt, l, names::kFusedGateUp, {E, H, 2 * I});
    const std::vector<float> gate_up_bias = layer_f32(ckpt, l, names::kFusedGateUpBias, {E, 2 * I});
    const std::vector<float> down = layer_f32(ckpt, l, names::kFusedDown, {E, I, H});
    const std::vector<float> down_bias = layer_f32(ckpt, l, names::kFusedDownBias, {E, H});
    L.biased_experts.resize(E);
    for (int64_t e = 0; e < E; ++e)
      L.biased_experts[e] = unpack_gpt_oss_expert(gate_up, gate_up_bias, down, down_bias, E, H, I, e);
  }
}

}  // namespace moesq::model
