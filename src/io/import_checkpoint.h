// Reading checkpoints in the compressed-tensors format, whether moesq exported them or another tool
// (llm-compressor, ModelOpt conversions) made them (docs/FORMAT.md §10 "Import"):
//  * `nvfp4-pack-quantized` (weight_packed U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
//    weight_global_scale F32 divisor): paired 4:8 detected from the data (export_layouts.h) → our
//    Sparse48Tensor (W4A4 with block 32), otherwise dense NVFP4 (W4A4 with block 16, or W4A16 when
//    input_activations is null);
//  * the same plus `paired48_sparse = {layout: "pair-bitmask", version: 1}`: weight_sparse_packed +
//    weight_sparse_mask → Sparse48Tensor;
//  * `pack-quantized` INT4 (symmetric, group quantized, weight_packed I32 [N, K/8] offset-8 nibbles,
//    element j of a word in bits 4j..4j+3, weight_scale [N, K/G], weight_shape [2]) → bf16-rounded
//    floats q·scale (weight-only).
// Anything else (another quant_method, format, weight or activation scheme) is refused with an Error
// naming the config field and its value.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/compressed_checkpoint.h"

namespace moesq::io {

// config.json quantization_config with quant_method "compressed-tensors"; `where` prefixes errors.
QuantizationConfig read_compressed_tensors_config(const nlohmann::json& qc, const std::string& where);

// The config group of a routed-expert projection module (its stored name, e.g.
// "model.layers.3.mlp.experts.7.gate_proj"), as compressed-tensors applies a config: an `ignore` entry
// that covers it → nullptr (the entry in *ignored_by); else the group with a target naming the module
// exactly, else one whose "re:" pattern matches (Python re.match: anchored at the start only), else
// one targeting the class "Linear" (every routed-expert projection is a Linear); among targets of one
// kind, the first group in config order. nullptr when no group covers it.
const CtConfigGroup* ct_group_of(const QuantizationConfig& q, const std::string& module,
                                 std::string* ignored_by = nullptr);
// The group of projection `prefix` (canonical name), which stores packed tensors: Error naming the
// module (and the ignore entry) when no group covers it.
const CtConfigGroup& ct_group_of_projection(const Checkpoint& ckpt, const QuantizationConfig& q,
                                            const std::string& prefix);
// Sets q.act_quant / act_group / act_block / scale_group / weight_group from the group(s) of the
// checkpoint's PACKED routed-expert projections (read_quantization_config calls it): an Error names a
// packed module that is ignored or targeted by no group, and two modules whose groups ask for
// different input activations (moesq runs one activation scheme for all routed experts).
void resolve_ct_expert_groups(const Checkpoint& ckpt, QuantizationConfig& q, const std::string& where);

// The static activation global scale γ_a of projection `prefix` (its input_global_scale: one finite
// positive element, shape [1] or 0-d), for input_activations.dynamic false; Error naming the tensor.
float read_input_global_scale(const Checkpoint& ckpt, const std::string& prefix);

// The static activation γ_a of routed expert `expert` of MoE layer `layer` when q.act_static and
// q.act_quant (input_activations.dynamic false): its gate|up input's — gate_proj's and up_proj's
// input_global_scale, which must be equal (the two read one input, quantized once; Error naming both
// otherwise) — and its down_proj input's. {0, 0} (dynamic: γ_a per token row, Eq. 5) when the config is
// dynamic or the expert is stored dense. Shared by the CPU loader and the GPU backends.
struct StaticActScales {
  float gate_up = 0.0f, down = 0.0f;
};
StaticActScales read_static_act_scales(const Checkpoint& ckpt, const QuantizationConfig& q, int64_t layer,
                                       int64_t expert);

// One NVFP4 projection of a compressed-tensors checkpoint (CtNvfp4 or CtPairBitmask layout).
format::PackedWeight read_compressed_tensors_weight(const Checkpoint& ckpt, const QuantizationConfig& q,
                                                    const std::string& prefix, int64_t N, int64_t K);
// One pack-quantized INT4 projection → [N, K] floats (each q·scale rounded to bf16).
std::vector<float> read_int4_weight(const Checkpoint& ckpt, const QuantizationConfig& q, const std::string& prefix,
                                    int64_t N, int64_t K);

// Does the checkpoint store projection `prefix` in a packed layout (any of the above or moesq's)?
bool has_packed_projection(const Checkpoint& ckpt, const std::string& prefix);

// Any routed-expert projection → fp32 [N, K]: HF .weight, moesq / compressed-tensors NVFP4 (exact
// dequantized values), or INT4. `*storage` (optional) says what the tensor was: Dense, Sparse48,
// Nvfp4 or Int4.
std::vector<float> read_expert_weight_f32(const Checkpoint& ckpt, const QuantizationConfig& q,
                                          const std::string& prefix, int64_t N, int64_t K,
                                          ExpertStorage* storage = nullptr);

// What one routed-expert projection holds, read from its tensors and data (`moesq inspect`): Dense
// (.weight), Sparse48 (moesq paired 4:8, pair-bitmask, or compressed-tensors NVFP4 that the detection
// rule of export_layouts.h finds paired 4:8), Nvfp4 (dense NVFP4) or Int4, plus the bytes of all its
// tensors. The packed tensors are read and validated as a load would (same Errors, naming the tensor).
struct ProjectionStorage {
  ExpertStorage storage = ExpertStorage::Dense;
  uint64_t bytes = 0;  // Σ nbytes of the projection's tensors (values, metadata, scales, global scales)
};
ProjectionStorage read_projection_storage(const Checkpoint& ckpt, const QuantizationConfig& q,
                                          const std::string& prefix, int64_t N, int64_t K);

// Activation block a compressed checkpoint runs with (W4A4), given how many of its projections hold
// paired 4:8 / dense NVFP4: a compressed-tensors NVFP4 checkpoint whose projections are ALL paired 4:8
// runs as moesq's deployment (block 32), otherwise with the dense block 16; other layouts: q.act_block.
int deployed_act_block(const QuantizationConfig& q, int64_t num_sparse48, int64_t num_nvfp4);

// Names for reports: "bf16" (dense), "paired-4:8-nvfp4", "nvfp4", "int4"; and the checkpoint layout:
// "moesq", "compressed-tensors/nvfp4-pack-quantized", ".../nvfp4-pack-quantized+pair-bitmask",
// "compressed-tensors/pack-quantized".
const char* expert_storage_name(ExpertStorage s);
const char* checkpoint_layout_name(CheckpointLayout l);

}  // namespace moesq::io
