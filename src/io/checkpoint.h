// A Hugging Face checkpoint directory: config.json plus one `model.safetensors` or shards listed in
// `model.safetensors.index.json` (weight_map: tensor → shard). Tensors are looked up by name across
// shards; an index entry whose shard lacks the tensor is an error naming both.
// A hub layout that nests the text model (io/hub_layout.h: Qwen3.5-MoE's wrapper config, the
// "model.language_model." prefix, fused experts) is presented FLAT: config() is the text model's
// config, names() / get() use the flat per-expert names; stored_name() and stored_config() map back
// for writers.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/hub_layout.h"
#include "io/safetensors.h"

namespace moesq::io {

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);  // Error naming the dir/file on any problem

  const std::string& dir() const { return dir_; }
  const ModelSpec& spec() const { return spec_; }
  // config.json (a nested layout: its text model's config, see io/hub_layout.h unwrap_text_config).
  const nlohmann::json& config() const { return config_; }
  const HubLayout& layout() const { return layout_; }
  // Flat names (the same as stored ones unless nested or fused).
  bool has(const std::string& name) const { return stored_.count(name) != 0 || views_.count(name) != 0; }
  const TensorView& get(const std::string& name) const;  // Error: "tensor X not found in DIR"
  std::vector<std::string> names() const;                // sorted
  // The name a writer stores flat tensor `name` under: the source's own name for a tensor it holds,
  // else the layout's rule (hub_tensor_name) for a new one (e.g. a packed expert projection).
  std::string stored_name(const std::string& name) const;
  // config.json to write for a text config `text` derived from config() (wrap_text_config).
  nlohmann::json stored_config(const nlohmann::json& text) const { return wrap_text_config(raw_config_, text, layout_); }
  // Both get_f32: Error for a NaN/inf entry naming file, tensor and index (to_f32_finite).
  std::vector<float> get_f32(const std::string& name) const { return to_f32_finite(get(name)); }
  // Checks shape; Error names the tensor, the expected and the actual shape.
  std::vector<float> get_f32(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> shard_files() const;  // absolute paths

 private:
  // Flat names of where_'s tensors: stored_ (flat → stored name), fused experts split into views_.
  void index_flat_names();

  std::string dir_;
  nlohmann::json raw_config_, config_;
  HubLayout layout_;
  ModelSpec spec_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsFile*> where_;  // stored name → shard
  std::map<std::string, std::string> stored_;            // flat name → stored name
  std::map<std::string, TensorView> views_;              // flat name → per-expert view of a fused tensor
};

// Writes a sharded or single-file checkpoint: shards of at most `max_shard_bytes`, plus the index
// when there is more than one shard. Files land in `dir`, which the caller made (AtomicDir).
// The default is transformers' save_pretrained max_shard_size "5GB" (5·10^9 bytes), what hub
// checkpoints are cut to.
inline constexpr size_t kDefaultMaxShardBytes = size_t(5'000'000'000);
void write_checkpoint_tensors(const std::string& dir, const SafetensorsWriter& all,
                              size_t max_shard_bytes = kDefaultMaxShardBytes);
// A shard size as transformers writes it: bytes, or a number with B, KB, MB, GB (powers of 1000) or
// KiB, MiB, GiB (powers of 1024), e.g. "5GB", "500MB", "64KiB"; Error naming `flag` and the value
// for anything else, zero included.
size_t parse_shard_size(const std::string& text, const std::string& flag = "--max-shard-size");

}  // namespace moesq::io
