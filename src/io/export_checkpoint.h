// `moesq export`: rewrites a compressed checkpoint (moesq's own layout or any layout
// io/import_checkpoint.h reads) into another layout (docs/FORMAT.md §8, §9):
//   moesq               §7: weight_packed / weight_meta / weight_scale [N, K/32] / weight_global_scale
//   compressed-tensors  nvfp4-pack-quantized, what vLLM / SGLang load (dense NVFP4; 4.25 bpw at group 32,
//                       4.5 at group 16)
//   moesq-pair-bitmask  weight_sparse_packed + weight_sparse_mask, paired48_sparse marker (2.75 bpw at
//                       group 32, 3.0 at group 16)
// Non-expert tensors are copied unchanged; config.json gets the layout's quantization_config; the
// other files of the source (tokenizer, report.json, …) travel along.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"

namespace moesq::io {

enum class ExportFormat { Moesq, CompressedTensors, PairBitmask };
// "moesq" | "compressed-tensors" | "moesq-pair-bitmask"; Error naming `flag` and the value otherwise.
ExportFormat parse_export_format(const std::string& s, const std::string& flag = "--format");
const char* export_format_name(ExportFormat f);

// The compressed-tensors quantization_config of an export: config_groups (weights and input
// activations: float, 4 bits, tensor_group, group_size `scale_block` (16 or 32), symmetric; inputs
// dynamic "local"), targets ["Linear"], `ignore` = every module of `src` that is not a routed-expert
// projection (plus lm_head), and for pair-bitmask the paired48_sparse marker.
nlohmann::json compressed_tensors_config_json(const Checkpoint& src, bool pair_bitmask, int scale_block);

// The module names (tensor name minus its last component) of every non-routed-expert tensor of `src`,
// plus "lm_head", sorted and unique.
std::vector<std::string> unquantized_modules(const Checkpoint& src);

// Writes the export of `src` into `dir` (made by the caller, e.g. an AtomicDir). Returns a summary:
// format, scale_block, projections, expert_bytes, bits_per_expert_weight, input_global_scale source.
// scale_block (compressed-tensors / pair-bitmask only): 32 writes weight_scale F8_E4M3 [N, K/32] and
// group_size 32, the layout of the paper's reference (IST-DASLab/MoESQ), paired 4:8 experts only
// (Error naming the tensor otherwise); 16 writes [N, K/16] with each 32-block scale twice (what a
// stock server's dense NVFP4 path takes); 0 = 32 when the experts are paired 4:8, else 16.
// The tensors go to shards of at most max_shard_bytes, with model.safetensors.index.json when there is
// more than one (write_checkpoint_tensors).
nlohmann::json write_exported_checkpoint(const Checkpoint& src, ExportFormat f, const std::string& dir,
                                         int scale_block = 0, size_t max_shard_bytes = kDefaultMaxShardBytes);

// AtomicDir around write_exported_checkpoint: OUT replaced only when it is empty or holds `marker`;
// writes OUT/export.json (the summary).
nlohmann::json export_checkpoint(const std::string& src_dir, ExportFormat f, const std::string& out_dir,
                                 const std::string& marker = "export.json", int scale_block = 0,
                                 size_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace moesq::io
