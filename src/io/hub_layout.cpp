// Hub layouts (see the header). The non-obvious decision: the split is a view, not a copy — a
// fused [E, 2I, H] tensor holds expert e's gate rows and up rows as two contiguous [I, H] blocks
// and down_proj[e] is one contiguous [H, I] block — so a 397B checkpoint costs no extra memory and
// every per-expert reader (loader, compress, inspect, census) runs unchanged on the mmap.
#include "io/hub_layout.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"
#include "io/tensor_names.h"

namespace moesq::io {

namespace {

using nlohmann::json;

struct Wrapper {
  const char* model_type;       // the wrapper's config.json model_type
  const char* text_model_type;  // what its text_config describes
  const char* text_prefix;      // where the text model's tensors are
};
constexpr Wrapper kWrappers[] = {
    {"qwen3_5_moe", "qwen3_5_moe_text", "model.language_model."},
};

// Wrapper keys that describe the text model too, lifted when text_config lacks them.
constexpr const char* kLiftedKeys[] = {"quantization_config", "tie_word_embeddings", "architectures"};

constexpr const char* kFusedGateUp = "gate_up_proj";
constexpr const char* kFusedDown = "down_proj";

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

}  // namespace

json unwrap_text_config(const json& config, const std::string& source, HubLayout* layout) {
  *layout = HubLayout{};
  if (!config.is_object() || !config.contains("model_type") || !config["model_type"].is_string()) return config;
  const std::string mt = config["model_type"].get<std::string>();
  const Wrapper* w = nullptr;
  for (const Wrapper& c : kWrappers)
    if (mt == c.model_type) w = &c;
  if (!w) return config;
  MOESQ_CHECK(config.contains("text_config"), source, ": model_type \"", mt,
              "\" is a multimodal wrapper but has no key \"text_config\" (the text model's config)");
  const json& tc = config["text_config"];
  MOESQ_CHECK(tc.is_object(), source, ": key \"text_config\" must be an object, got ", tc.dump());
  json text = tc;
  if (!text.contains("model_type") || text["model_type"].is_null()) text["model_type"] = w->text_model_type;
  MOESQ_CHECK(text["model_type"] == w->text_model_type, source, ": text_config.model_type is ",
              text["model_type"].dump(), ", expected \"", w->text_model_type, "\" inside a \"", mt, "\" wrapper");
  layout->wrapper_model_type = mt;
  layout->text_prefix = w->text_prefix;
  for (const char* k : kLiftedKeys)
    if (config.contains(k) && !text.contains(k)) {
      text[k] = config[k];
      layout->lifted_keys.push_back(k);
    }
  return text;
}

json wrap_text_config(const json& raw, const json& text, const HubLayout& layout) {
  if (!layout.nested()) return text;
  json out = raw;
  json inner = text;
  for (const char* k : kLiftedKeys) {
    const bool lifted = std::find(layout.lifted_keys.begin(), layout.lifted_keys.end(), k) != layout.lifted_keys.end();
    // quantization_config always lives at the top of a wrapper (transformers and vLLM read it there).
    if (!lifted && std::string(k) != "quantization_config") continue;
    if (inner.contains(k)) {
      out[k] = inner[k];
      inner.erase(k);
    }
  }
  out["text_config"] = inner;
  return out;
}

std::string flat_tensor_name(const HubLayout& layout, const std::string& stored) {
  if (layout.text_prefix.empty() || !starts_with(stored, layout.text_prefix)) return stored;
  return "model." + stored.substr(layout.text_prefix.size());
}

std::string hub_tensor_name(const HubLayout& layout, const std::string& flat) {
  if (layout.text_prefix.empty() || !starts_with(flat, "model.")) return flat;
  return layout.text_prefix + flat.substr(6);
}

bool has_fused_qwen_experts(const ModelSpec& spec) { return spec.model_type == "qwen3_5_moe_text"; }

std::vector<TensorView> split_fused_experts(const ModelSpec& spec, const std::string& flat, const TensorView& t) {
  if (!has_fused_qwen_experts(spec) || !starts_with(flat, "model.layers.")) return {};
  // "model.layers.{l}.mlp.experts.{gate_up_proj|down_proj}"
  const size_t l0 = 13, l1 = flat.find('.', l0);
  if (l1 == std::string::npos || l1 == l0) return {};
  const std::string rest = flat.substr(l1 + 1);
  const bool gate_up = rest == std::string("mlp.experts.") + kFusedGateUp;
  if (!gate_up && rest != std::string("mlp.experts.") + kFusedDown) return {};
  const std::string digits = flat.substr(l0, l1 - l0);
  MOESQ_CHECK(digits.find_first_not_of("0123456789") == std::string::npos, t.file, ": tensor ", t.name,
              " has no layer number");
  const int64_t l = std::strtoll(digits.c_str(), nullptr, 10);
  MOESQ_CHECK(l < spec.num_layers && spec.is_moe_layer(l), t.file, ": fused expert tensor ", t.name, " is in layer ", l,
              ", which is not an MoE layer of this config (num_hidden_layers ", spec.num_layers, ")");
  const int64_t E = spec.num_experts, H = spec.hidden_size, I = spec.moe_intermediate_size;
  const std::vector<int64_t> want = gate_up ? std::vector<int64_t>{E, 2 * I, H} : std::vector<int64_t>{E, H, I};
  TensorView w;
  w.shape = want;
  MOESQ_CHECK(t.shape == want, t.file, ": fused expert tensor ", t.name, " has shape ", t.shape_str(), ", expected ",
              w.shape_str(), gate_up ? " [num_experts, 2·moe_intermediate_size, hidden_size]"
                                     : " [num_experts, hidden_size, moe_intermediate_size]");
  MOESQ_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32, t.file,
              ": fused expert tensor ", t.name, " is ", dtype_name(t.dtype), "; moesq reads bf16/f16/f32 experts");
  const size_t es = dtype_size(t.dtype), block = static_cast<size_t>(I * H) * es;  // one [I, H] or [H, I]
  std::vector<TensorView> out;
  for (int64_t e = 0; e < E; ++e) {
    const int n_parts = gate_up ? 2 : 1;
    for (int part = 0; part < n_parts; ++part) {
      const ExpertProj p = gate_up ? (part == 0 ? ExpertProj::Gate : ExpertProj::Up) : ExpertProj::Down;
      TensorView v;
      v.name = expert_tensor_prefix(spec, l, e, p) + kWeight;
      v.dtype = t.dtype;
      v.shape = gate_up ? std::vector<int64_t>{I, H} : std::vector<int64_t>{H, I};
      v.data = t.data + (static_cast<size_t>(e) * n_parts + part) * block;
      v.nbytes = block;
      v.file = t.file + " (expert " + std::to_string(e) + " of fused " + t.name + ")";
      out.push_back(std::move(v));
    }
  }
  return out;
}

}  // namespace moesq::io
