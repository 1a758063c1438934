// Every tensor name moesq reads or writes, in one place (Hugging Face Qwen3-MoE layout, plus the
// compressed-tensors style suffixes of a compressed checkpoint, docs/FORMAT.md). The loader, the
// exporter and `inspect` build and recognise names only through these functions.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>

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

// "model.layers.{layer}.{rest}", e.g. layer_tensor(0, "self_attn.q_proj.weight").
std::string layer_tensor(int64_t layer, const std::string& rest);
// "model.layers.{layer}.mlp.experts.{expert}.{proj}" (append a suffix above).
std::string expert_tensor_prefix(int64_t layer, int64_t expert, const char* proj);
std::string expert_tensor_prefix(int64_t layer, int64_t expert, ExpertProj proj);

// "model.layers.{l}.mlp.experts.{e}.{proj}.{suffix}" taken apart: proj is the text up to the next
// '.', suffix everything after it. nullopt when the name does not have that form.
struct ExpertTensorName {
  int64_t layer = 0, expert = 0;
  std::string proj, suffix;
};
std::optional<ExpertTensorName> parse_expert_tensor(const std::string& name);
// A routed-expert projection tensor: parse_expert_tensor succeeds with proj gate_proj|up_proj|down_proj.
bool is_expert_tensor(const std::string& name);
// Any tensor under a routed-expert container (".mlp.experts." in the name), whatever its layout.
bool in_expert_container(const std::string& name);

}  // namespace moesq::io
