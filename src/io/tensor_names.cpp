#include "io/tensor_names.h"

#include <cctype>
#include <limits>

#include "core/error.h"

namespace moesq::io {

namespace {

// Reads the decimal digits at name[pos...] into *out; false if there are none.
bool read_index(const std::string& name, size_t& pos, int64_t* out) {
  const size_t start = pos;
  int64_t v = 0;
  while (pos < name.size() && std::isdigit(static_cast<unsigned char>(name[pos]))) {
    // A name from a file: "model.layers.99999999999999999999." is no index (it overflowed int64 before,
    // undefined behaviour, and wrapped to a negative layer that passed `layer < num_layers`).
    if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return false;
    v = v * 10 + (name[pos] - '0');
    ++pos;
  }
  *out = v;
  return pos > start;
}

bool read_literal(const std::string& name, size_t& pos, const char* lit) {
  const std::string l(lit);
  if (name.compare(pos, l.size(), l) != 0) return false;
  pos += l.size();
  return true;
}

// Routed-expert containers of the supported families (the part between "model.layers.{l}." and
// ".experts.").
constexpr const char* kMoeBlocks[] = {"mlp", "block_sparse_moe"};
// Mixtral's names for gate, up, down.
constexpr std::array<const char*, 3> kMixtralProjNames = {"w1", "w3", "w2"};

LayerTensorNames qwen2_moe_names() {
  LayerTensorNames t{"qwen2_moe"};
  t.shared_expert = "mlp.shared_expert";
  t.shared_expert_gate = "mlp.shared_expert_gate.weight";
  return t;
}

// Qwen3-Next / Qwen3.5 text: Qwen2-MoE's shared expert and gate under their own model_type.
LayerTensorNames hybrid_names(const char* model_type) {
  LayerTensorNames t = qwen2_moe_names();
  t.model_type = model_type;
  return t;
}

LayerTensorNames mixtral_names() {
  LayerTensorNames t{"mixtral"};
  t.moe_block = "block_sparse_moe";
  t.expert_proj = kMixtralProjNames;
  return t;
}

// DeepSeek-V3 / Kimi-K2: shared experts (plural) and the router's selection bias; the MLA names are in
// io/tensor_names_deepseek_v3.h.
LayerTensorNames deepseek_v3_names(const char* model_type) {
  LayerTensorNames t{model_type};
  t.shared_expert = "mlp.shared_experts";
  t.router_bias = "mlp.gate.e_score_correction_bias";
  return t;
}

// gpt-oss: router "mlp.router" with a logit bias; experts fused with biases.
LayerTensorNames gpt_oss_names() {
  LayerTensorNames t{"gpt_oss"};
  t.router = "router";
  t.router_logit_bias = "mlp.router.bias";
  t.fused_gate_up = "mlp.experts.gate_up_proj";
  t.fused_gate_up_bias = "mlp.experts.gate_up_proj_bias";
  t.fused_down = "mlp.experts.down_proj";
  t.fused_down_bias = "mlp.experts.down_proj_bias";
  return t;
}

// The fused weights' names after "model.layers.{l}." (a fused layout shared by gpt-oss and hub Qwen3.5).
constexpr const char* kFusedExpertWeights[] = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};

const LayerTensorNames kLayerNames[] = {
    LayerTensorNames{"qwen3_moe"},
    qwen2_moe_names(),
    mixtral_names(),
    LayerTensorNames{"olmoe"},
    deepseek_v3_names("deepseek_v3"),
    deepseek_v3_names("kimi_k2"),
    hybrid_names("qwen3_next"),
    hybrid_names("qwen3_5_moe_text"),
    gpt_oss_names(),
};

}  // namespace

const LayerTensorNames& layer_tensor_names(const std::string& model_type) {
  for (const LayerTensorNames& t : kLayerNames)
    if (model_type == t.model_type) return t;
  MOESQ_FAIL("model_type \"", model_type, "\" has no tensor-name table (io/tensor_names.cpp)");
}

std::string expert_tensor_prefix(const ModelSpec& spec, int64_t layer, int64_t expert, ExpertProj proj) {
  const LayerTensorNames& t = layer_tensor_names(spec.model_type);
  return layer_tensor(layer, std::string(t.moe_block) + ".experts." + std::to_string(expert) + "." +
                                 t.expert_proj[static_cast<int>(proj)]);
}

std::string router_tensor(const ModelSpec& spec, int64_t layer) {
  const LayerTensorNames& t = layer_tensor_names(spec.model_type);
  return layer_tensor(layer, std::string(t.moe_block) + "." + t.router + ".weight");
}

std::string family_layer_tensor(const ModelSpec& spec, int64_t layer, const char* rest, const char* what) {
  MOESQ_CHECK(rest, spec.model_type, ": the tensor-name table (io/tensor_names.cpp) has no ", what);
  return layer_tensor(layer, rest);
}

TensorRole tensor_role(const ModelSpec& spec, const std::string& name) {
  if (is_expert_tensor(name)) return TensorRole::RoutedExpert;
  if (const auto e = parse_expert_tensor(name); e && e->suffix == "bias" && expert_proj_of(e->proj))
    return TensorRole::ExpertBias;  // gpt-oss biases split per expert (the compressed-tensors export)
  size_t pos = 0;
  int64_t l = 0;
  if (!read_literal(name, pos, "model.layers.") || !read_index(name, pos, &l) || !read_literal(name, pos, "."))
    return TensorRole::Other;
  const std::string rest = name.substr(pos);
  const LayerTensorNames& t = layer_tensor_names(spec.model_type);
  const std::string moe = t.moe_block;
  auto starts = [&](const std::string& p) { return rest.compare(0, p.size(), p) == 0; };
  if (rest == moe + "." + t.router + ".weight") return TensorRole::Router;
  if (t.router_bias && rest == t.router_bias) return TensorRole::RouterBias;
  if (t.router_logit_bias && rest == t.router_logit_bias) return TensorRole::RouterBias;
  if ((t.fused_gate_up_bias && rest == t.fused_gate_up_bias) || (t.fused_down_bias && rest == t.fused_down_bias))
    return TensorRole::ExpertBias;
  if (t.shared_expert_gate && rest == t.shared_expert_gate) return TensorRole::SharedExpertGate;
  if (t.shared_expert && starts(std::string(t.shared_expert) + ".")) return TensorRole::SharedExpert;
  if (!spec.is_moe_layer(l) && starts("mlp.")) return TensorRole::DenseMlp;
  return TensorRole::Other;
}

const char* tensor_role_name(TensorRole r) {
  switch (r) {
    case TensorRole::RoutedExpert: return "routed_expert";
    case TensorRole::Router: return "router";
    case TensorRole::RouterBias: return "router_bias";
    case TensorRole::SharedExpert: return "shared_expert";
    case TensorRole::SharedExpertGate: return "shared_expert_gate";
    case TensorRole::DenseMlp: return "dense_mlp";
    case TensorRole::ExpertBias: return "expert_bias";
    case TensorRole::Other: return "other";
  }
  return "other";
}

std::string layer_tensor(int64_t layer, const std::string& rest) {
  return "model.layers." + std::to_string(layer) + "." + rest;
}

std::optional<ExpertTensorName> parse_expert_tensor(const std::string& name) {
  ExpertTensorName t;
  size_t pos = 0;
  if (!read_literal(name, pos, "model.layers.") || !read_index(name, pos, &t.layer) ||
      !read_literal(name, pos, "."))
    return std::nullopt;
  bool container = false;
  for (const char* block : kMoeBlocks)
    if (read_literal(name, pos, block)) {
      container = true;
      t.block = block;
      break;
    }
  if (!container || !read_literal(name, pos, ".experts.") || !read_index(name, pos, &t.expert) ||
      !read_literal(name, pos, "."))
    return std::nullopt;
  const size_t dot = name.find('.', pos);
  if (dot == std::string::npos || dot == pos) return std::nullopt;
  t.proj = name.substr(pos, dot - pos);
  t.suffix = name.substr(dot + 1);
  return t;
}

std::optional<ExpertProj> expert_proj_of(const std::string& proj) {
  for (int p = 0; p < 3; ++p)
    if (proj == kExpertProjNames[p] || proj == kMixtralProjNames[p]) return static_cast<ExpertProj>(p);
  return std::nullopt;
}

bool is_fused_expert_weight(const std::string& name, int64_t* layer) {
  size_t pos = 0;
  int64_t l = 0;
  if (!read_literal(name, pos, "model.layers.") || !read_index(name, pos, &l) || !read_literal(name, pos, "."))
    return false;
  for (const char* w : kFusedExpertWeights)
    if (name.compare(pos, std::string::npos, w) == 0) {
      if (layer) *layer = l;
      return true;
    }
  return false;
}

bool is_expert_tensor(const std::string& name) {
  if (is_fused_expert_weight(name)) return true;
  const auto t = parse_expert_tensor(name);
  if (!t || t->suffix == "bias") return false;  // a per-expert Linear bias is kept as stored (ExpertBias)
  const auto& projs = t->block == "block_sparse_moe" ? kMixtralProjNames : kExpertProjNames;
  for (const char* p : projs)
    if (t->proj == p) return true;
  return false;
}

bool is_compressed_expert_tensor(const ModelSpec& spec, const std::string& name) {
  int64_t l = 0;
  if (is_fused_expert_weight(name, &l)) return l < spec.num_layers && spec.is_moe_layer(l);
  if (!is_expert_tensor(name)) return false;
  const auto t = parse_expert_tensor(name);
  return t->layer < spec.num_layers && spec.is_moe_layer(t->layer) && t->expert < spec.num_experts;
}

bool in_expert_container(const std::string& name) {
  for (const char* block : kMoeBlocks)
    if (name.find("." + std::string(block) + ".experts.") != std::string::npos) return true;
  return false;
}

}  // namespace moesq::io
