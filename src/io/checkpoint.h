// A Hugging Face checkpoint directory: config.json plus one `model.safetensors` or shards listed in
// `model.safetensors.index.json` (weight_map: tensor → shard). Tensors are looked up by name across
// shards; an index entry whose shard lacks the tensor is an error naming both.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/safetensors.h"

namespace moesq::io {

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);  // Error naming the dir/file on any problem

  const std::string& dir() const { return dir_; }
  const ModelSpec& spec() const { return spec_; }
  const nlohmann::json& config() const { return config_; }  // raw config.json
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const TensorView& get(const std::string& name) const;  // Error: "tensor X not found in DIR"
  std::vector<std::string> names() const;                // sorted
  // Both get_f32: Error for a NaN/inf entry naming file, tensor and index (to_f32_finite).
  std::vector<float> get_f32(const std::string& name) const { return to_f32_finite(get(name)); }
  // Checks shape; Error names the tensor, the expected and the actual shape.
  std::vector<float> get_f32(const std::string& name, const std::vector<int64_t>& shape) const;
  std::vector<std::string> shard_files() const;  // absolute paths

 private:
  std::string dir_;
  nlohmann::json config_;
  ModelSpec spec_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// Writes a sharded or single-file checkpoint: shards of at most `max_shard_bytes`, plus the index
// when there is more than one shard. Files land in `dir`, which the caller made (AtomicDir).
void write_checkpoint_tensors(const std::string& dir, const SafetensorsWriter& all,
                              size_t max_shard_bytes = size_t(2) << 30);

}  // namespace moesq::io
