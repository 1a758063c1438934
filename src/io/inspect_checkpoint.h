// What a checkpoint holds, counted from its tensors (the census behind `moesq inspect`): sizes from
// config.json, tensor and shard counts, LOGICAL parameter counts (a packed expert projection counts
// the N×K of the dense weight it replaces, its scales and metadata count as bytes only, so a model
// reports the same parameters before and after compression), bytes and bits per routed-expert
// weight, and per projection what its tensors HOLD (io::read_projection_storage validates them: a
// compressed-tensors NVFP4 tensor is called paired 4:8 only when its data is).
// Every expert name comes from the family's table (io/tensor_names.h), so Mixtral's w1/w3/w2 under
// block_sparse_moe are found like Qwen's gate_proj/up_proj/down_proj under mlp.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"

namespace moesq::io {

// One routed-expert projection (gate, up or down) over all MoE layers and experts.
struct ProjectionInspection {
  std::string name;                        // the family's name: "gate_proj" (Mixtral "w1"), "up_proj", "down_proj"
  int64_t count = 0;                       // projections found (MoE layers × experts, fused ones included)
  int64_t N = 0, K = 0;                    // logical [N, K] (PyTorch Linear [out, in])
  std::map<std::string, int64_t> storage;  // io::expert_storage_name → projections stored that way
  uint64_t bytes = 0;                      // Σ stored bytes (values, metadata, scales)
  double bits_per_weight = 0.0;            // bytes · 8 / (count · N · K)
};

struct ParameterCounts {
  int64_t total = 0, routed_experts = 0, non_expert = 0;
  double expert_share = 0.0;     // routed_experts / total (0 when total is 0)
  int64_t active_per_token = 0;  // non_expert + routed_experts · top_k / E, rounded
};

struct CheckpointInspection {
  std::string dir;
  ModelSpec spec;
  std::optional<nlohmann::json> architectures;  // config.json "architectures" when a non-empty array
  int64_t moe_layers = 0;
  int64_t tensors = 0, shards = 0;
  int64_t expert_projections = 0;           // routed-expert projections found (dense, packed or fused)
  int64_t expert_projections_expected = 0;  // moe_layers · E · 3
  int64_t expert_projections_packed = 0, expert_projections_dense = 0, expert_projections_mismatched = 0;
  int64_t other_expert_tensors = 0;         // tensors in an expert container of no known layout
  ParameterCounts parameters;
  uint64_t expert_bytes = 0, non_expert_bytes = 0;
  double expert_bits_per_weight = 0.0;      // expert_bytes · 8 / routed-expert parameters (0 without experts)
  bool compressed = false;                  // config.json has a non-null quantization_config
  std::string expert_storage;               // "dense", "packed" or "mixed"
  std::vector<ProjectionInspection> projections;  // gate, up, down order; those with no tensors left out
  // Compressed only: io::checkpoint_layout_name (+ " group_size 16" or " group_size 32 (reference
  // layout)" for compressed-tensors NVFP4), what eval / generate run with ("nvfp4 block 32" or
  // "none (weight-only)"), the INT4 weight group (CtInt4 only) and the quantization_config as stored.
  std::string layout, activations;
  std::optional<int64_t> weight_group;
  nlohmann::json quantization_config;
  std::map<std::string, std::pair<int64_t, uint64_t>> dtypes;  // dtype name → (tensors, bytes)
  nlohmann::json not_compressed;  // io::not_compressed_summary
};

// Reads DIR's config and tensors. A half-compressed checkpoint (config and tensors disagree) is an
// Error naming the first mismatching tensor unless allow_mixed, and then reported as "mixed"; errors
// of io::Checkpoint (missing directory, bad config) and of the projection readers pass through.
CheckpointInspection inspect_checkpoint(const std::string& dir, bool allow_mixed = false);

}  // namespace moesq::io
