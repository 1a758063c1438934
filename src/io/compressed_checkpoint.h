// The moesq compressed checkpoint (docs/FORMAT.md), read and written in one place: config.json's
// `quantization_config`, and the tensors of each packed routed-expert projection
// (`.weight_packed` E2M1 codes, `.weight_meta` pair metadata for paired 4:8, `.weight_scale` UE4M3
// block scales, `.weight_global_scale` γ as a divisor). compress/report.cpp writes through it,
// model/loader.cpp reads through it. The packed types themselves live in format.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/packed_weight.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"

namespace moesq::io {

// Dense: HF .weight tensors (bf16/f16/f32). Int4: compressed-tensors pack-quantized (dequantized on load).
enum class ExpertStorage { Dense, Sparse48, Nvfp4, Int4 };
// Which tensor layout carries the experts (docs/FORMAT.md §7–§10; io/import_checkpoint.h).
enum class CheckpointLayout { Moesq, CtNvfp4, CtPairBitmask, CtInt4 };

// One compressed-tensors config group (config_groups.<name>), as read by io/import_checkpoint.h.
struct CtConfigGroup {
  std::string name;                  // the key under config_groups ("group_0")
  std::vector<std::string> targets;  // module names, "re:" patterns (Python re.match), class names ("Linear")
  int scale_group = 16;              // NVFP4 weights.group_size (16 or 32)
  int weight_group = 0;              // INT4 weights.group_size
  bool act_quant = false;            // input_activations is not null (W4A4)
  int act_group = 0;                 // input_activations.group_size (0 when null)
  bool act_static = false;           // input_activations.dynamic false: the stored input_global_scale is γ_a
};

// What config.json's quantization_config says (Dense when it has none).
struct QuantizationConfig {
  ExpertStorage storage = ExpertStorage::Dense;
  std::string format_name = "bf16";  // "paired-4:8-nvfp4" | "nvfp4" when compressed
  int act_block = 32;                // activation quantization block of the W4A4 deployment
  CheckpointLayout layout = CheckpointLayout::Moesq;
  bool act_quant = true;             // false: weight-only (compressed-tensors input_activations null)
  int weight_group = 0;              // CtInt4: elements per scale along K
  int scale_group = 16;              // CtNvfp4 / CtPairBitmask: elements per weight_scale along K (16 or 32)
  int act_group = 0;                 // compressed-tensors input_activations.group_size (0 when null)
  bool act_static = false;           // compressed-tensors input_activations.dynamic false (static γ_a)
  // compressed-tensors: every config group and the ignore entries; a routed-expert projection is read
  // with the group that targets its module (ct_group_of), and act_quant / act_group / scale_group
  // above are those of the routed experts' group(s) (read_quantization_config resolves them).
  std::vector<CtConfigGroup> groups;
  std::vector<std::string> ignore;
};
// Error naming DIR/config.json for an unknown format or a bad input_activations.block_size.
QuantizationConfig read_quantization_config(const Checkpoint& ckpt);
// The quantization_config moesq writes; `method` names the compression method.
nlohmann::json quantization_config_json(bool sparse48, const std::string& method);

// One packed projection [N, K] at `prefix` (expert_tensor_prefix): its tensors into `w` / back.
void add_packed_weight(SafetensorsWriter& w, const std::string& prefix, const format::PackedWeight& p);
// Errors name the tensor and the directory (missing tensor, dtype, shape, global scale ≤ 0).
format::PackedWeight read_packed_weight(const Checkpoint& ckpt, const QuantizationConfig& q,
                                        const std::string& prefix, int64_t N, int64_t K);

// Writes the compressed checkpoint's tensors and config.json into `dir` (made by the caller, e.g.
// an AtomicDir): every non-expert tensor of `src` and every copied_expert_tensors one unchanged, each routed-expert projection from
// `packed(layer, expert, proj)`, config.json = src's plus quantization_config, and the other files of
// src (tokenizer, generation config) copied.
using PackedExpertSource = std::function<const format::PackedWeight&(int64_t layer, int64_t expert, ExpertProj proj)>;
// Shards of at most max_shard_bytes (+ model.safetensors.index.json when more than one).
void write_compressed_checkpoint(const Checkpoint& src, const PackedExpertSource& packed, bool sparse48,
                                 const std::string& method, const std::string& dir,
                                 size_t max_shard_bytes = kDefaultMaxShardBytes);

// Routed-expert tensors of `src` that compression does not replace (!is_compressed_expert_tensor, e.g. a
// multi-token-prediction layer past num_hidden_layers): write_compressed_checkpoint and the exports copy
// them as stored; compress lists them in report.json ("copied_expert_tensors"). Sorted.
std::vector<std::string> copied_expert_tensors(const Checkpoint& src);

// Copies the files of `src` other than config.json and its safetensors (tokenizer, generation config,
// report.json, …) into `dir`.
void copy_side_files(const Checkpoint& src, const std::string& dir);

// Storage of every routed-expert projection of `ckpt`, against what its quantization_config says.
// A "half-compressed" checkpoint (some projections still dense `.weight`, the rest packed, or packed
// tensors with no quantization_config) loads only with --allow-mixed.
struct ExpertStorageCensus {
  int64_t packed = 0;          // projections stored as .weight_packed (+ scales)
  int64_t dense = 0;           // projections stored as a dense .weight
  std::string first_mismatch;  // first tensor (layer, expert, proj order) disagreeing with q; "" if none
  int64_t mismatches = 0;
};
ExpertStorageCensus census_expert_storage(const Checkpoint& ckpt, const QuantizationConfig& q);
// Error naming the first mismatching tensor, the counts and DIR, unless allow_mixed.
void check_expert_storage(const Checkpoint& ckpt, const QuantizationConfig& q, bool allow_mixed);

// What a compressed checkpoint of `src` keeps as stored (not compressed), counted by role from the
// family's tensor-name table: {"router": n, "router_bias": n, "shared_expert": n, "shared_expert_gate": n,
// "dense_mlp": n, "expert_bias": n, "other": n, "copied_expert": n, "dense_mlp_layers": [l, ...]} (tensor
// counts; "expert_bias" = gpt-oss's fused expert biases; "other" = attention, norms, embeddings, head;
// "copied_expert" = routed-expert tensors of layers the model does not run, copied_expert_tensors).
nlohmann::json not_compressed_summary(const Checkpoint& src);

// Bytes of the compressed routed-expert tensors of a checkpoint (is_compressed_expert_tensor: to measure
// bits/weight from what was written; a copied extra layer is not counted).
int64_t expert_tensor_bytes(const Checkpoint& ckpt);

}  // namespace moesq::io
