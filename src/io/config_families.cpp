// The families moesq reads, one parser each: which keys carry the shared fields (CommonConfigKeys)
// and the family's own facts (router scoring, q/k norm span, biases, shared experts). The
// non-obvious decision: a key that would change the forward in a way moesq does not implement
// (Mixtral's sliding window, qkv clipping) is an error naming it, never silently ignored.
#include "io/config_families.h"

#include "core/error.h"
#include "io/config_deepseek_v3.h"
#include "io/config_hybrid.h"
#include "io/config_keys.h"

namespace moesq::io {

namespace {

using nlohmann::json;
using namespace config_keys;

// Which layers slide, as transformers decides it (checked against transformers 5.x): with
// use_sliding_window false, or sliding_window null, none. Otherwise Qwen3-MoE slides every layer
// (Qwen3MoeConfig has neither max_window_layers nor layer_types; Qwen3MoeModel builds ONE
// sliding-window causal mask for all layers); Qwen2-MoE follows config.json's `layer_types`
// ("sliding_attention" / "full_attention", one per layer: transformers 5 writes it), and without one
// Qwen2MoeConfig's default: layer i slides when i is even and i < max_window_layers (default 28).
enum class WindowDefault { AllLayers, LayerTypesOrEvenBelowMaxWindowLayers };

void parse_sliding_window(const json& j, const std::string& source, WindowDefault rule, ModelSpec& s) {
  if (!bool_or(j, "use_sliding_window", false, source)) return;
  const json* w = find(j, "sliding_window");
  if (!w) return;  // transformers: sliding_window None = the full causal mask
  const int64_t window = get_int(*w, "sliding_window", source);
  MOESQ_CHECK(window > 0, source, ": key \"sliding_window\" must be positive with use_sliding_window = true, got ",
              window);
  s.attention_window.assign(static_cast<size_t>(s.num_layers), rule == WindowDefault::AllLayers ? window : 0);
  if (rule == WindowDefault::AllLayers) return;
  if (const json* lt = find(j, "layer_types")) {
    MOESQ_CHECK(lt->is_array() && static_cast<int64_t>(lt->size()) == s.num_layers, source,
                ": key \"layer_types\" must be a list of num_hidden_layers = ", s.num_layers, " strings, got ",
                lt->dump());
    for (int64_t l = 0; l < s.num_layers; ++l) {
      const json& t = (*lt)[static_cast<size_t>(l)];
      MOESQ_CHECK(t == "sliding_attention" || t == "full_attention", source, ": layer_types[", l, "] = ", t.dump(),
                  " (expected \"sliding_attention\" or \"full_attention\")");
      if (t == "sliding_attention") s.attention_window[l] = window;
    }
    return;
  }
  const json* mw = find(j, "max_window_layers");
  const int64_t max_window_layers = mw ? get_int(*mw, "max_window_layers", source) : 28;
  for (int64_t l = 0; l < s.num_layers; ++l)
    if (l % 2 == 0 && l < max_window_layers) s.attention_window[l] = window;
}

// Qwen3MoeConfig: per-head q/k RMSNorm, softmax router, renormalised when norm_topk_prob.
void parse_qwen3_moe(const json& j, const std::string& source, ModelSpec& s) {
  parse_common_config(j, source, CommonConfigKeys{}, s);
  parse_sliding_window(j, source, WindowDefault::AllLayers, s);
}

// Qwen2MoeConfig: q/k/v biases (o_proj none), no q/k norm, one shared expert of
// shared_expert_intermediate_size behind a sigmoid gate, norm_topk_prob default false.
void parse_qwen2_moe(const json& j, const std::string& source, ModelSpec& s) {
  CommonConfigKeys keys;
  keys.head_dim_required = false;
  parse_common_config(j, source, keys, s);
  parse_sliding_window(j, source, WindowDefault::LayerTypesOrEvenBelowMaxWindowLayers, s);
  s.qk_norm = QkNorm::None;
  s.qkv_bias = bool_or(j, "qkv_bias", true, source);  // transformers < 5 always had q/k/v biases
  s.shared_expert_intermediate_size = require_positive(j, "shared_expert_intermediate_size", source);
  s.num_shared_experts = 1;
  s.shared_expert_gate = true;
}

// MixtralConfig: expert width is intermediate_size, no q/k norm, top-k always renormalised.
void parse_mixtral(const json& j, const std::string& source, ModelSpec& s) {
  CommonConfigKeys keys;
  keys.expert_width = "intermediate_size";
  keys.head_dim_required = false;
  parse_common_config(j, source, keys, s);
  MOESQ_CHECK(!find(j, "sliding_window"), source, ": sliding_window = ", j["sliding_window"].dump(),
              " is not supported (moesq runs full causal attention; null disables it)");
  s.qk_norm = QkNorm::None;
  s.norm_topk_prob = true;  // MixtralSparseMoeBlock divides the top-k weights by their sum
}

// OlmoeConfig: expert width is intermediate_size, q/k RMSNorm over the whole projection,
// norm_topk_prob default false.
void parse_olmoe(const json& j, const std::string& source, ModelSpec& s) {
  CommonConfigKeys keys;
  keys.expert_width = "intermediate_size";
  keys.head_dim_required = false;
  parse_common_config(j, source, keys, s);
  MOESQ_CHECK(!find(j, "clip_qkv"), source, ": clip_qkv = ", j["clip_qkv"].dump(),
              " is not supported (null disables it)");
  s.qk_norm = QkNorm::Whole;
}

// DeepseekV3Config (DeepSeek-V3, Kimi-K2 as kimi_k2): MLA, sigmoid grouped router and shared experts;
// its keys are read by io/config_deepseek_v3.h, which also keeps the MLA dims the mixer needs.
void parse_deepseek_v3(const json& j, const std::string& source, ModelSpec& s) {
  fill_model_spec(parse_deepseek_v3_config(j, source), s);
}

// Qwen3NextConfig / Qwen3_5MoeTextConfig: the full key set is parsed by io/config_hybrid.cpp;
// the decoder reads the shared fields, the mixer factory (model/mixers/hybrid_mixer.h) the rest.
void parse_hybrid(const json& j, const std::string& source, ModelSpec& s) {
  const FamilySpec f = parse_family_config(j, source);
  s = f.base;
  s.qk_norm = QkNorm::PerHead;  // inside the family mixer
  s.rms_norm_unit_offset = f.zero_centered_norms;
  if (f.shared_expert_intermediate_size > 0) {
    s.num_shared_experts = 1;
    s.shared_expert_intermediate_size = f.shared_expert_intermediate_size;
    s.shared_expert_gate = true;
  }
}

// GptOssConfig (keys parsed by io/config_hybrid.cpp): the router adds a bias to its logits and
// takes the softmax over the top-k logits; experts carry biases and run the clamped SwiGLU; the
// sink / sliding-window attention with YaRN is the mixer's (model/mixers/sink_attention.h).
void parse_gpt_oss(const json& j, const std::string& source, ModelSpec& s) {
  const FamilySpec f = parse_family_config(j, source);
  s = f.base;
  s.qk_norm = QkNorm::None;  // inside the family mixer (gpt-oss has none)
  s.router_scoring = RouterScoring::TopkSoftmax;
  s.router_logit_bias = true;
  s.expert_bias = true;
  s.clamped_swiglu = true;
  s.swiglu_alpha = f.swiglu_alpha;
  s.swiglu_limit = f.swiglu_limit;
}

constexpr ConfigFamily kFamilies[] = {
    {"qwen3_moe", parse_qwen3_moe},
    {"qwen2_moe", parse_qwen2_moe},
    {"mixtral", parse_mixtral},
    {"olmoe", parse_olmoe},
    {"deepseek_v3", parse_deepseek_v3},
    {"kimi_k2", parse_deepseek_v3},
    {"qwen3_next", parse_hybrid},
    {"qwen3_5_moe_text", parse_hybrid},
    {"gpt_oss", parse_gpt_oss},
};

}  // namespace

const ConfigFamily* find_config_family(const std::string& model_type) {
  for (const ConfigFamily& f : kFamilies)
    if (model_type == f.model_type) return &f;
  return nullptr;
}

std::string supported_model_types() {
  std::string out;
  for (const ConfigFamily& f : kFamilies) out += (out.empty() ? "" : ", ") + std::string(f.model_type);
  return out;
}

}  // namespace moesq::io
