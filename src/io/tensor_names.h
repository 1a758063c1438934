// Every tensor name moesq reads or writes, in one place (Hugging Face layouts of each supported family,
// plus the compressed-tensors style suffixes of a compressed checkpoint, docs/FORMAT.md). The loader,
// the exporter and `inspect` build and recognise names only through these functions and tables.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "io/config.h"

namespace moesq::io {

// Routed-expert projections of one SwiGLU expert, in this order everywhere (gate [I, H], up [I, H],
// down [H, I]).
enum class ExpertProj { Gate = 0, Up = 1, Down = 2 };
constexpr std::array<const char*, 3> kExpertProjNames = {"gate_proj", "up_proj", "down_proj"};

// Whole-model tensors.
inline constexpr const char* kEmbedTokens = "model.embed_tokens.weight";  // [V, H]
inline constexpr const char* kFinalNorm = "model.norm.weight";            // [H]
inline constexpr const char* kLmHead = "lm_head.weight";                  // [V, H] (absent when tied)

// Suffixes of one projection: a dense weight, or a packed NVFP4 / paired 4:8 NVFP4 one.
inline constexpr const char* kWeight = ".weight";
inline constexpr const char* kWeightPacked = ".weight_packed";              // U8 E2M1 codes
inline constexpr const char* kWeightMeta = ".weight_meta";                  // U8 pair metadata (4:8)
inline constexpr const char* kWeightScale = ".weight_scale";                // F8_E4M3 block scales
inline constexpr const char* kWeightGlobalScale = ".weight_global_scale";   // F32 γ (divisor)
// Exported / imported layouts (docs/FORMAT.md §8–§10).
inline constexpr const char* kInputGlobalScale = ".input_global_scale";     // F32 γ_a (divisor)
inline constexpr const char* kWeightSparsePacked = ".weight_sparse_packed"; // U8 kept bytes (pair-bitmask)
inline constexpr const char* kWeightSparseMask = ".weight_sparse_mask";     // U8 chunk masks (pair-bitmask)
inline constexpr const char* kWeightShape = ".weight_shape";                // I64/I32 [2] (pack-quantized INT4)

// The norms around the mixer and the MLP, the same in every family (relative to "model.layers.{l}.").
inline constexpr const char* kInputNorm = "input_layernorm.weight";        // [H]
inline constexpr const char* kPostNorm = "post_attention_layernorm.weight";  // [H]

// Per-family names inside one decoder layer (relative to "model.layers.{l}."): one row per family
// in tensor_names.cpp. Attention is "self_attn.{q,k,v,o}_proj.{weight,bias}" and
// "self_attn.{q,k}_norm.weight", norms "input_layernorm" / "post_attention_layernorm", a dense MLP
// layer "mlp.{gate,up,down}_proj" in every family; what differs is below.
struct LayerTensorNames {
  const char* model_type;
  // The sparse block: router "{moe_block}.gate.weight" [E, H], routed experts
  // "{moe_block}.experts.{e}.{expert_proj[p]}" (p = gate, up, down).
  const char* moe_block = "mlp";
  std::array<const char*, 3> expert_proj = kExpertProjNames;
  // Shared expert MLP "{shared_expert}.{gate,up,down}_proj.weight", or nullptr when the family has none.
  const char* shared_expert = nullptr;
  const char* shared_expert_gate = nullptr;  // [1, H] "….weight", or nullptr
  const char* router_bias = nullptr;         // e_score_correction_bias [E], or nullptr
  // The router module inside the MoE block: "{moe_block}.{router}.weight" [E, H] ("gate"; gpt-oss "router").
  const char* router = "gate";
  const char* router_logit_bias = nullptr;   // bias added to the router logits [E] (gpt-oss), or nullptr
  // Fused expert tensors of the source (gpt-oss): weights [E, H, 2I] (gate in the even, up in the odd
  // columns) and [E, I, H], biases [E, 2I] (interleaved likewise) and [E, H]; nullptr = per-expert tensors.
  // A compressed checkpoint stores the weights per expert ("{moe_block}.experts.{e}.{gate,up,down}_proj",
  // Linear layout) and keeps the two bias tensors as stored (docs/FORMAT.md §7, fused-expert sources).
  const char* fused_gate_up = nullptr;
  const char* fused_gate_up_bias = nullptr;
  const char* fused_down = nullptr;
  const char* fused_down_bias = nullptr;
};
// The row of `model_type`; Error naming it when the family has no table.
const LayerTensorNames& layer_tensor_names(const std::string& model_type);
// "{moe_block}.experts.{e}.{proj}" of the family, under "model.layers.{l}." (append a suffix).
std::string expert_tensor_prefix(const ModelSpec& spec, int64_t layer, int64_t expert, ExpertProj proj);
// "model.layers.{l}.{moe_block}.{router}.weight": the router of the family.
std::string router_tensor(const ModelSpec& spec, int64_t layer);
// "model.layers.{l}.{rest}" for a name of the family's table (e.g. t.fused_gate_up); Error naming the
// family when the table has no such name (rest == nullptr).
std::string family_layer_tensor(const ModelSpec& spec, int64_t layer, const char* rest, const char* what);

// What a tensor of a `spec` checkpoint is, from the family's table: compression replaces only
// RoutedExpert tensors; every other role is kept byte-identical (and listed as not compressed).
// ExpertBias: the routed experts' biases (gpt-oss), kept bf16 as stored.
enum class TensorRole { RoutedExpert, Router, RouterBias, SharedExpert, SharedExpertGate, DenseMlp, ExpertBias, Other };
TensorRole tensor_role(const ModelSpec& spec, const std::string& name);
const char* tensor_role_name(TensorRole r);  // "routed_expert", "router", ...

// "model.layers.{layer}.{rest}", e.g. layer_tensor(0, "self_attn.q_proj.weight").
std::string layer_tensor(int64_t layer, const std::string& rest);

// "model.layers.{l}.{mlp|block_sparse_moe}.experts.{e}.{proj}.{suffix}" taken apart: proj is the text
// up to the next '.', suffix everything after it. nullopt when the name does not have that form.
struct ExpertTensorName {
  int64_t layer = 0, expert = 0;
  std::string block;  // the MoE block: "mlp" or "block_sparse_moe"
  std::string proj, suffix;
};
std::optional<ExpertTensorName> parse_expert_tensor(const std::string& name);
// A routed-expert projection tensor: parse_expert_tensor succeeds with proj gate_proj|up_proj|down_proj
// under "mlp", or Mixtral's w1|w3|w2 under "block_sparse_moe", or a fused expert weight
// (is_fused_expert_weight). Shared experts ("mlp.shared_expert.…") are not routed experts, nor is a
// per-expert `….{proj}.bias` (gpt-oss's biases as the compressed-tensors export writes them: role
// ExpertBias, copied as stored like the fused bias tensors).
bool is_expert_tensor(const std::string& name);
// A routed-expert tensor that compression replaces: in one of the model's MoE layers (below
// num_hidden_layers) and, per expert, below num_experts. Other routed-expert tensors — e.g. the
// multi-token-prediction layer `model.layers.{num_hidden_layers}.*` DeepSeek-V3 ships, which the
// forward never runs — are copied whole (io::copied_expert_tensors).
bool is_compressed_expert_tensor(const ModelSpec& spec, const std::string& name);
// "model.layers.{l}.mlp.experts.gate_up_proj" or "….down_proj": all experts of a layer in one 3-D weight
// (gpt-oss; hub Qwen3.5). Their biases ("…_bias") are not weights. Sets *layer when given.
bool is_fused_expert_weight(const std::string& name, int64_t* layer = nullptr);
// Which projection `proj` is (gate_proj / w1 → Gate, up_proj / w3 → Up, down_proj / w2 → Down), if any.
std::optional<ExpertProj> expert_proj_of(const std::string& proj);
// Any tensor under a routed-expert container (".mlp.experts." or ".block_sparse_moe.experts." in the
// name), whatever its layout.
bool in_expert_container(const std::string& name);

}  // namespace moesq::io
