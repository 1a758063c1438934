// Hub layouts that nest the text model (Qwen3.5-MoE as published: Qwen3_5MoeForConditionalGeneration).
//   config.json: the wrapper's, model_type "qwen3_5_moe", the text model's keys under "text_config"
//                (model_type "qwen3_5_moe_text");
//   tensors:     the text model under "model.language_model." ("lm_head.weight" stays at the top; the
//                vision tower "model.visual.*" and any "mtp.*" are not the text model's);
//   experts:     FUSED per layer, "mlp.experts.gate_up_proj" [E, 2I, H] (rows 0..I−1 the gate
//                projection, I..2I−1 the up projection: transformers' Qwen3_5MoeExperts splits the
//                product with chunk(2, dim=−1), vLLM's loader the weight with chunk(2, dim=−2)) and
//                "mlp.experts.down_proj" [E, H, I]; every expert's slice is a PyTorch Linear weight.
// io::Checkpoint presents such a checkpoint in the FLAT per-expert layout every reader of moesq
// uses ("model.layers.{l}.mlp.experts.{e}.gate_proj.weight" [I, H], … — zero-copy views into the
// fused tensors, which are contiguous per expert) and maps names back when writing: a compressed
// checkpoint keeps the source's nesting and wrapper config, with the routed experts written PER
// EXPERT (the compressed-tensors layout vLLM's Qwen3.5-MoE loader also reads), docs/FORMAT.md.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/safetensors.h"

namespace moesq::io {

struct HubLayout {
  std::string wrapper_model_type;         // "" = a flat checkpoint (nothing nested)
  std::string text_prefix;                // "model.language_model." when nested (and the tensors use it), else ""
  std::vector<std::string> lifted_keys;   // wrapper keys copied into the text config (not its own)
  bool nested() const { return !wrapper_model_type.empty(); }
};

// The text model's config of `config` (source: "DIR/config.json", for errors). A known wrapper
// model_type must hold a "text_config" object (Error naming the key otherwise); its model_type is
// filled in when absent and must be the wrapper's text model_type when present; the wrapper's
// quantization_config, tie_word_embeddings and architectures are lifted into it where it has none
// of its own. Any other config is returned unchanged with a flat layout.
nlohmann::json unwrap_text_config(const nlohmann::json& config, const std::string& source, HubLayout* layout);

// The config.json to write for a checkpoint whose text config is now `text` (e.g. with a
// quantization_config added): flat → `text`; nested → the stored wrapper `raw` with text_config =
// `text` minus the lifted keys, and `text`'s lifted keys (quantization_config, …) at the top.
nlohmann::json wrap_text_config(const nlohmann::json& raw, const nlohmann::json& text, const HubLayout& layout);

// Stored name → flat name ("model.language_model.X" → "model.X"; other names unchanged).
std::string flat_tensor_name(const HubLayout& layout, const std::string& stored);
// Flat name of a text-model tensor → the name to store it under ("model.X" → "model.language_model.X").
std::string hub_tensor_name(const HubLayout& layout, const std::string& flat);

// Whether `spec`'s family stores routed experts fused as above (qwen3_5_moe_text).
bool has_fused_qwen_experts(const ModelSpec& spec);
// If `flat` is a fused expert tensor "model.layers.{l}.mlp.experts.{gate_up_proj|down_proj}" of such a
// family: the per-expert views it holds — names "model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight"
// (gate and up from gate_up_proj, down from down_proj), data pointing into `t`. Empty when `flat` is not
// one. Errors name the stored tensor (t.name), its shape and the expected [E, 2I, H] / [E, H, I], a
// non-floating dtype, or a layer that is not an MoE layer.
std::vector<TensorView> split_fused_experts(const ModelSpec& spec, const std::string& flat, const TensorView& t);

}  // namespace moesq::io
