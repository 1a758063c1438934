// Loads a checkpoint of any family (model/families.h) into DecoderModel: HF tensor names from the
// family's table (io/tensor_names.h), every shape checked against the spec with an error naming the
// tensor and the directory.
//
// Routed experts come either as HF `.weight` tensors (bf16/f16/f32) or as a moesq compressed
// checkpoint (read by io/compressed_checkpoint.h). Compressed experts are decoded once to their exact
// dequantized fp32 values (ŵ = dec(q)·dec(c_b)/γ is exact in fp32), so the forward is the same code
// for both; the decision that matters is that a compressed checkpoint's default_forward_options()
// is W4A4 (act_quant with the format's block size): a W4A4 deployment quantizes activations too,
// and evaluating it W4A16 would flatter it.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/config_check.h"
#include "io/compressed_checkpoint.h"
#include "io/import_checkpoint.h"
#include "io/tensor_names.h"
#include "model/decoder.h"
#include "model/fused_experts.h"
#include "model/families.h"

namespace moesq::model {

namespace {

// A dense weight as fp32. F8_E4M3 weights are block-quantized FP8 (DeepSeek style, with a
// `weight_scale_inv` beside them): their raw codes are not the weights, and moesq does not apply the
// scales, so such a tensor is refused by name rather than read as if it were bf16.
std::vector<float> dense_weight(const io::Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape) {
  const io::TensorView& t = ckpt.get(name);
  MOESQ_CHECK(t.dtype != io::DType::F8_E4M3, t.file, ": tensor ", name,
              " is F8_E4M3 (an FP8 block-quantized checkpoint): moesq reads bf16/f16/f32 weights; "
              "dequantize it with its weight_scale_inv first");
  return ckpt.get_f32(name, shape);
}

// One expert projection W [N, K] → fp32, from whichever representation the checkpoint holds
// (io/import_checkpoint.h: HF .weight, moesq or compressed-tensors NVFP4, INT4). Counts paired 4:8
// and dense NVFP4 tensors: a compressed-tensors checkpoint says which it is only through its data.
struct PackedCount {
  int64_t sparse48 = 0, nvfp4 = 0;
};
std::vector<float> load_projection(const io::Checkpoint& ckpt, const io::QuantizationConfig& q,
                                   const std::string& prefix, int64_t N, int64_t K, PackedCount& count) {
  if (ckpt.has(prefix + io::kWeight)) return dense_weight(ckpt, prefix + io::kWeight, {N, K});
  io::ExpertStorage st = io::ExpertStorage::Dense;
  std::vector<float> w;
  // Format-level errors (a NaN block-scale code, a bad metadata nibble) know no names: add the
  // projection and its file here, at the io boundary.
  try {
    w = io::read_expert_weight_f32(ckpt, q, prefix, N, K, &st);
  } catch (const Error& e) {
    const std::string file =
        ckpt.has(prefix + io::kWeightPacked) ? ckpt.get(prefix + io::kWeightPacked).file : ckpt.dir();
    MOESQ_FAIL(file, ": tensor ", prefix, io::kWeightPacked, " (with ", prefix, io::kWeightScale, "): ", e.what());
  }
  count.sparse48 += st == io::ExpertStorage::Sparse48;
  count.nvfp4 += st == io::ExpertStorage::Nvfp4;
  return w;
}

// Static activation scales (compressed-tensors input_activations.dynamic false): γ_a of each packed
// projection's input is its stored input_global_scale (io::read_static_act_scales).
void load_static_act_scales(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, int64_t l, int64_t e,
                            ExpertWeights& W) {
  const io::StaticActScales a = io::read_static_act_scales(ckpt, q, l, e);
  W.gate_up_act_scale = a.gate_up;
  W.down_act_scale = a.down;
}

// The expert biases of MoE layer l of a fused-expert family as the fused tensors lay them out
// (gate_up [E, 2I] interleaved, down [E, H]): from the fused bias tensors when the checkpoint has them
// (the source, moesq's own layout), else gathered from the per-expert Linear biases
// `experts.{e}.{gate_proj|up_proj|down_proj}.bias` the compressed-tensors export writes (FORMAT.md).
void load_fused_biases(const io::Checkpoint& ckpt, const io::ModelSpec& s, const io::LayerTensorNames& names,
                       int64_t l, std::vector<float>& gu_bias, std::vector<float>& dn_bias) {
  const int64_t H = s.hidden_size, E = s.num_experts, I = s.moe_intermediate_size;
  const std::string gu = io::family_layer_tensor(s, l, names.fused_gate_up_bias, "gate_up_proj bias");
  const std::string dn = io::family_layer_tensor(s, l, names.fused_down_bias, "down_proj bias");
  if (ckpt.has(gu) || ckpt.has(dn) || !ckpt.has(io::expert_tensor_prefix(s, l, 0, io::ExpertProj::Gate) + ".bias")) {
    gu_bias = dense_weight(ckpt, gu, {E, 2 * I});
    dn_bias = dense_weight(ckpt, dn, {E, H});
    return;
  }
  gu_bias.assign(E * 2 * I, 0.0f);
  dn_bias.assign(E * H, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    auto bias = [&](io::ExpertProj p, int64_t n) {
      return dense_weight(ckpt, io::expert_tensor_prefix(s, l, e, p) + ".bias", {n});
    };
    const std::vector<float> g = bias(io::ExpertProj::Gate, I), u = bias(io::ExpertProj::Up, I),
                             d = bias(io::ExpertProj::Down, H);
    for (int64_t i = 0; i < I; ++i) {
      gu_bias[e * 2 * I + 2 * i] = g[i];
      gu_bias[e * 2 * I + 2 * i + 1] = u[i];
    }
    std::copy(d.begin(), d.end(), dn_bias.begin() + e * H);
  }
}

// The routed experts of MoE layer l of a fused-expert family (gpt-oss, io::LayerTensorNames::fused_*):
// biases from load_fused_biases (a compressed checkpoint keeps them as stored or per expert); gate|up
// and down each from its fused weight when the checkpoint has it (the source), else per expert in
// Linear layout under io::expert_tensor_prefix (what compression writes).
void load_fused_experts(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, const io::ModelSpec& s,
                        const io::LayerTensorNames& names, int64_t l, std::vector<ExpertWeights>& experts,
                        PackedCount& count, bool& any_packed) {
  const int64_t H = s.hidden_size, E = s.num_experts, I = s.moe_intermediate_size;
  const std::string gu = io::family_layer_tensor(s, l, names.fused_gate_up, "fused gate_up_proj");
  const std::string dn = io::family_layer_tensor(s, l, names.fused_down, "fused down_proj");
  std::vector<float> gu_bias, dn_bias;  // [E, 2I], [E, H]
  load_fused_biases(ckpt, s, names, l, gu_bias, dn_bias);
  std::vector<float> gu_w, dn_w;  // [E, H, 2I], [E, I, H] (empty: per-expert tensors)
  if (ckpt.has(gu)) gu_w = dense_weight(ckpt, gu, {E, H, 2 * I});
  if (ckpt.has(dn)) dn_w = dense_weight(ckpt, dn, {E, I, H});
  for (int64_t e = 0; e < E; ++e) {
    ExpertWeights& W = experts[e];
    unpack_fused_gate_up(gu_w.empty() ? nullptr : gu_w.data(), gu_bias.data(), E, H, I, e, W);
    unpack_fused_down(dn_w.empty() ? nullptr : dn_w.data(), dn_bias.data(), E, H, I, e, W);
    for (int p = 0; p < 3; ++p) {
      const bool fused = p < 2 ? !gu_w.empty() : !dn_w.empty();
      if (fused) continue;
      const std::string prefix = io::expert_tensor_prefix(s, l, e, static_cast<io::ExpertProj>(p));
      if (io::has_packed_projection(ckpt, prefix)) any_packed = true;
      MOESQ_CHECK(ckpt.has(prefix + io::kWeight) || io::has_packed_projection(ckpt, prefix), ckpt.dir(),
                  ": layer ", l, " has neither the fused tensor ", p < 2 ? gu : dn, " nor the per-expert ", prefix,
                  io::kWeightPacked);
      std::vector<float>& dst = p == 0 ? W.gate : p == 1 ? W.up : W.down;
      dst = load_projection(ckpt, q, prefix, p < 2 ? I : H, p < 2 ? H : I, count);
    }
    load_static_act_scales(ckpt, q, l, e, W);
  }
}

// The routed experts of MoE layer l, from whichever layout the family stores (fused or per expert).
void load_layer_experts(const io::Checkpoint& ckpt, const io::QuantizationConfig& q, const io::ModelSpec& s,
                        const io::LayerTensorNames& names, int64_t l, std::vector<ExpertWeights>& experts,
                        PackedCount& count, bool& any_packed) {
  const int64_t H = s.hidden_size, E = s.num_experts, I = s.moe_intermediate_size;
  if (names.fused_gate_up) {
    load_fused_experts(ckpt, q, s, names, l, experts, count, any_packed);
    return;
  }
  for (int64_t e = 0; e < E; ++e) {
    ExpertWeights& W = experts[e];
    std::string prefix[3];
    for (int p = 0; p < 3; ++p) {
      prefix[p] = io::expert_tensor_prefix(s, l, e, static_cast<io::ExpertProj>(p));
      if (io::has_packed_projection(ckpt, prefix[p])) any_packed = true;
    }
    W.gate = load_projection(ckpt, q, prefix[0], I, H, count);
    W.up = load_projection(ckpt, q, prefix[1], I, H, count);
    W.down = load_projection(ckpt, q, prefix[2], H, I, count);
    load_static_act_scales(ckpt, q, l, e, W);
  }
}

// Experts on demand apply to dense-stored experts only (LoadOptions::experts_on_demand).
bool loads_experts_on_demand(const io::Checkpoint& ckpt, const LoadOptions& lo) {
  return lo.experts_on_demand && io::read_quantization_config(ckpt).storage == io::ExpertStorage::Dense;
}

}  // namespace

void load_fused_expert_biases(const io::Checkpoint& ckpt, int64_t layer, std::vector<float>& gate_up_bias,
                              std::vector<float>& down_bias) {
  const io::ModelSpec& s = ckpt.spec();
  const io::LayerTensorNames& names = io::layer_tensor_names(s.model_type);
  MOESQ_CHECK(s.expert_bias && names.fused_gate_up_bias, ckpt.dir(), ": model_type \"", s.model_type,
              "\" has no fused expert biases");
  load_fused_biases(ckpt, s, names, layer, gate_up_bias, down_bias);
}

std::vector<ExpertWeights> load_moe_layer_experts(const io::Checkpoint& ckpt, const io::QuantizationConfig& q,
                                                  int64_t layer) {
  const io::ModelSpec& s = ckpt.spec();
  MOESQ_CHECK(layer >= 0 && layer < s.num_layers && s.is_moe_layer(layer), ckpt.dir(), ": layer ", layer,
              " is not a MoE layer");
  std::vector<ExpertWeights> experts(s.num_experts);
  PackedCount count;
  bool any_packed = false;
  load_layer_experts(ckpt, q, s, io::layer_tensor_names(s.model_type), layer, experts, count, any_packed);
  return experts;
}

class ModelLoader {
 public:
  static void load(DecoderModel& m, const io::Checkpoint& ckpt, const LoadOptions& lo) {
    const io::ModelSpec& s = m.spec_;
    const ModelFamily* family = find_model_family(s.model_type);
    MOESQ_CHECK(family, ckpt.dir(), ": model_type \"", s.model_type, "\" has no CPU forward (model/families.cpp)");
    const io::LayerTensorNames& names = io::layer_tensor_names(s.model_type);
    const int64_t H = s.hidden_size, V = s.vocab_size, hd = s.head_dim, E = s.num_experts;
    const io::QuantizationConfig q = io::read_quantization_config(ckpt);
    io::check_expert_storage(ckpt, q, lo.allow_mixed);
    const bool on_demand = loads_experts_on_demand(ckpt, lo);

    m.embed_ = dense_weight(ckpt, io::kEmbedTokens, {V, H});
    m.final_norm_ = dense_weight(ckpt, io::kFinalNorm, {H});
    // Zero-centred RMSNorms: (1 + w) once here, in fp32 as transformers computes it.
    auto unit_offset = [&](std::vector<float>& w) {
      if (s.rms_norm_unit_offset)
        for (float& v : w) v += 1.0f;
    };
    unit_offset(m.final_norm_);
    // tie_word_embeddings: true ties the head to the embedding as transformers does (tie_weights runs
    // after loading, so an lm_head.weight in the files is overwritten, i.e. ignored).
    if (s.tie_word_embeddings) {
      m.lm_head_ = m.embed_;
    } else {
      MOESQ_CHECK(ckpt.has(io::kLmHead), "tensor lm_head.weight not found in ", ckpt.dir(),
                  " and tie_word_embeddings is false");
      m.lm_head_ = dense_weight(ckpt, io::kLmHead, {V, H});
    }
    bool any_packed = false;
    PackedCount count;
    for (int64_t l = 0; l < s.num_layers; ++l) {
      LayerWeights& L = m.layers_[l];
      auto get = [&](const std::string& rest, const std::vector<int64_t>& shape) {
        return dense_weight(ckpt, io::layer_tensor(l, rest), shape);
      };
      L.input_norm = get(io::kInputNorm, {H});
      unit_offset(L.input_norm);
      if (family->make_mixer) {
        L.mixer = family->make_mixer(ckpt, s, l);
      } else {
        L.q_proj = get("self_attn.q_proj.weight", {s.num_heads * hd, H});
        L.k_proj = get("self_attn.k_proj.weight", {s.num_kv_heads * hd, H});
        L.v_proj = get("self_attn.v_proj.weight", {s.num_kv_heads * hd, H});
        L.o_proj = get("self_attn.o_proj.weight", {H, s.num_heads * hd});
        if (s.attention_bias || s.qkv_bias) {  // attention_bias: all four; qkv_bias (Qwen2-MoE): q/k/v
          L.q_bias = get("self_attn.q_proj.bias", {s.num_heads * hd});
          L.k_bias = get("self_attn.k_proj.bias", {s.num_kv_heads * hd});
          L.v_bias = get("self_attn.v_proj.bias", {s.num_kv_heads * hd});
        }
        if (s.attention_bias) L.o_bias = get("self_attn.o_proj.bias", {H});
        if (s.qk_norm == io::QkNorm::PerHead) {
          L.q_norm = get("self_attn.q_norm.weight", {hd});
          L.k_norm = get("self_attn.k_norm.weight", {hd});
        } else if (s.qk_norm == io::QkNorm::Whole) {
          L.q_norm = get("self_attn.q_norm.weight", {s.num_heads * hd});
          L.k_norm = get("self_attn.k_norm.weight", {s.num_kv_heads * hd});
        }
      }
      L.post_norm = get(io::kPostNorm, {H});
      unit_offset(L.post_norm);
      if (!s.is_moe_layer(l)) {
        const int64_t Id = s.intermediate_size;
        L.dense_mlp.gate = get("mlp.gate_proj.weight", {Id, H});
        L.dense_mlp.up = get("mlp.up_proj.weight", {Id, H});
        L.dense_mlp.down = get("mlp.down_proj.weight", {H, Id});
        continue;
      }
      L.router = dense_weight(ckpt, io::router_tensor(s, l), {E, H});
      if (s.router_correction_bias) {
        MOESQ_CHECK(names.router_bias, s.model_type, ": router_correction_bias without a tensor name");
        L.router_bias = get(names.router_bias, {E});
      }
      if (s.num_shared_experts > 0) {
        MOESQ_CHECK(names.shared_expert, s.model_type, ": shared experts without a tensor name");
        const int64_t Is = s.shared_expert_intermediate_size;
        const std::string se = names.shared_expert;
        L.shared_expert.gate = get(se + ".gate_proj.weight", {Is, H});
        L.shared_expert.up = get(se + ".up_proj.weight", {Is, H});
        L.shared_expert.down = get(se + ".down_proj.weight", {H, Is});
        if (s.shared_expert_gate) {
          MOESQ_CHECK(names.shared_expert_gate, s.model_type, ": a shared-expert gate without a tensor name");
          L.shared_expert_gate = get(names.shared_expert_gate, {1, H});
        }
      }
      if (s.router_logit_bias)
        L.router_logit_bias =
            dense_weight(ckpt, io::family_layer_tensor(s, l, names.router_logit_bias, "router logit bias"), {E});
      if (!on_demand) load_layer_experts(ckpt, q, s, names, l, L.experts, count, any_packed);
    }
    if (on_demand) {
      // Dense experts only (experts_on_demand): nothing packed to count. The spec is copied: the
      // model may move, the checkpoint may not.
      m.load_experts_fn_ = [&ckpt, q, spec = s, &names](int64_t l, std::vector<ExpertWeights>& experts) {
        PackedCount unused_count;
        bool unused_packed = false;
        load_layer_experts(ckpt, q, spec, names, l, experts, unused_count, unused_packed);
      };
    }
    if (q.storage != io::ExpertStorage::Dense) {
      MOESQ_CHECK(any_packed, ckpt.dir(), "/config.json declares quantization_config format \"",
                  q.format_name, "\" but no expert has a .weight_packed tensor");
      m.default_options_.act_quant = q.act_quant && q.storage != io::ExpertStorage::Int4;
      m.default_options_.act_block = q.act_block;
      m.expert_format_ = q.format_name;
      if (q.layout != io::CheckpointLayout::Moesq && q.storage != io::ExpertStorage::Int4) {
        // compressed-tensors NVFP4: all experts paired 4:8 → moesq's deployment (block 32); else dense.
        const bool sparse = count.nvfp4 == 0 && count.sparse48 > 0;
        m.expert_format_ = sparse ? "paired-4:8-nvfp4" : "nvfp4";
        m.default_options_.act_block = io::deployed_act_block(q, count.sparse48, count.nvfp4);
      } else if (q.storage == io::ExpertStorage::Int4) {
        m.expert_format_ = "int4-pack-quantized";
      }
    }
  }
};

namespace {
// The spec, once config.json's sizes agree with the stored tensors: DecoderModel(spec) allocates from them.
const io::ModelSpec& checked_spec(const io::Checkpoint& ckpt) {
  io::check_config_against_tensors(ckpt);
  return ckpt.spec();
}
}  // namespace

DecoderModel::DecoderModel(const io::Checkpoint& ckpt, const LoadOptions& lo)
    : DecoderModel(checked_spec(ckpt), !loads_experts_on_demand(ckpt, lo)) {
  ModelLoader::load(*this, ckpt, lo);
}

}  // namespace moesq::model
