// The census of `moesq inspect` (see the header). The non-obvious decision: the per-projection
// section walks the family's expected names (layer, expert, projection) rather than the tensors
// found, so a projection stored in no recognised layout is simply not counted there (it shows up in
// other_expert_tensors instead), while the totals walk every tensor once.
#include "io/inspect_checkpoint.h"

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/config_check.h"
#include "io/compressed_checkpoint.h"
#include "io/import_checkpoint.h"
#include "io/tensor_names.h"

namespace moesq::io {

namespace {

// Logical N×K of one routed-expert projection (gate/up [I, H], down [H, I]: the same count).
int64_t expert_projection_numel(const ModelSpec& s, const std::string& proj, const std::string& tensor) {
  MOESQ_CHECK(expert_proj_of(proj), "tensor ", tensor, ": unknown expert projection \"", proj, "\"");
  return s.moe_intermediate_size * s.hidden_size;
}

bool is_plain_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;  // Mixtral: w1
  return true;
}

// Parameter and byte totals over every tensor, the dtype histogram, and the projection count.
void count_tensors(const Checkpoint& ck, CheckpointInspection& r) {
  const ModelSpec& s = r.spec;
  int64_t expert_params = 0, non_expert_params = 0;
  for (const std::string& name : ck.names()) {
    const TensorView& t = ck.get(name);
    auto& [count, bytes] = r.dtypes[dtype_name(t.dtype)];
    ++count;
    bytes += t.nbytes;
    // A routed-expert tensor of a layer the model does not run (a multi-token-prediction layer past
    // num_hidden_layers): kept as stored, like the other non-expert tensors (io::copied_expert_tensors).
    const bool copied = is_expert_tensor(name) && !is_compressed_expert_tensor(s, name);
    if (!in_expert_container(name) || copied) {
      non_expert_params += t.numel();
      r.non_expert_bytes += t.nbytes;
      continue;
    }
    r.expert_bytes += t.nbytes;
    if (is_fused_expert_weight(name)) {  // all experts of a layer in one [E, ·, ·] tensor (gpt-oss)
      expert_params += t.numel();
      r.expert_projections += t.numel() / (s.moe_intermediate_size * s.hidden_size);  // gate_up: 2E, down: E
      continue;
    }
    if (tensor_role(s, name) == TensorRole::ExpertBias) {  // expert biases: kept as stored
      expert_params += t.numel();
      continue;
    }
    // model.layers.{l}.{block}.experts.{e}.{proj}.{suffix}, proj and suffix plain [a-z0-9_]+ names
    const std::optional<ExpertTensorName> m = parse_expert_tensor(name);
    const bool plain = m && is_plain_name(m->proj) && is_plain_name(m->suffix);
    if (plain && m->suffix == "weight") {
      expert_params += t.numel();  // dense expert weight
      ++r.expert_projections;
    } else if (plain && ("." + m->suffix == kWeightPacked || "." + m->suffix == kWeightSparsePacked)) {
      expert_params += expert_projection_numel(s, m->proj, name);
      ++r.expert_projections;
    } else if (!plain) {
      expert_params += t.numel();  // some other expert layout: numel is all we know
      ++r.other_expert_tensors;
    }
    // else: scales / metadata of a compressed projection — bytes only.
  }
  ParameterCounts& p = r.parameters;
  p.routed_experts = expert_params;
  p.non_expert = non_expert_params;
  p.total = non_expert_params + expert_params;
  p.expert_share = p.total ? static_cast<double>(expert_params) / static_cast<double>(p.total) : 0.0;
  // Per token only top_k of num_experts routed experts run in each MoE layer.
  const double active = static_cast<double>(non_expert_params) + static_cast<double>(expert_params) *
                                                                   static_cast<double>(s.top_k) /
                                                                   static_cast<double>(s.num_experts);
  p.active_per_token = static_cast<int64_t>(active + 0.5);
  r.expert_bits_per_weight =
      expert_params ? 8.0 * static_cast<double>(r.expert_bytes) / static_cast<double>(expert_params) : 0.0;
}

// Projection p over all MoE layers and experts: the storage each one's tensors hold. Counts the
// sparse / NVFP4 projections into *num_sparse48 / *num_nvfp4 (the deployed activation block).
ProjectionInspection inspect_projection(const Checkpoint& ck, const QuantizationConfig& q, ExpertProj p,
                                        int64_t* num_sparse48, int64_t* num_nvfp4) {
  const ModelSpec& s = ck.spec();
  const LayerTensorNames& names = layer_tensor_names(s.model_type);
  const bool down = p == ExpertProj::Down;
  ProjectionInspection r;
  r.name = names.expert_proj[static_cast<int>(p)];
  r.N = down ? s.hidden_size : s.moe_intermediate_size;
  r.K = down ? s.moe_intermediate_size : s.hidden_size;
  const char* fused = down ? names.fused_down : names.fused_gate_up;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (!s.is_moe_layer(l)) continue;
    if (fused && ck.has(layer_tensor(l, fused))) {  // one dense tensor for the layer (gate_up: half each)
      const TensorView& t = ck.get(layer_tensor(l, fused));
      r.storage[expert_storage_name(ExpertStorage::Dense)] += s.num_experts;
      r.bytes += down ? t.nbytes : t.nbytes / 2;
      r.count += s.num_experts;
      continue;
    }
    int64_t first_missing = -1, present = 0;
    for (int64_t e = 0; e < s.num_experts; ++e) {
      const std::string prefix = expert_tensor_prefix(s, l, e, p);
      if (!ck.has(prefix + kWeight) && !has_packed_projection(ck, prefix)) {  // other layout, or missing
        if (first_missing < 0) first_missing = e;
        continue;
      }
      ++present;
      if (ck.has(prefix + kWeight)) {  // a dense weight must have the shape config.json implies
        const TensorView& t = ck.get(prefix + kWeight);
        MOESQ_CHECK(t.shape == std::vector<int64_t>({r.N, r.K}), t.file, ": tensor ", t.name, " has shape ",
                    t.shape_str(), " but config.json (", down ? "hidden_size x moe_intermediate_size" :
                    "moe_intermediate_size x hidden_size", ") says [", r.N, ", ", r.K, "]");
      }
      const ProjectionStorage ps = read_projection_storage(ck, q, prefix, r.N, r.K);
      ++r.storage[expert_storage_name(ps.storage)];
      *num_sparse48 += ps.storage == ExpertStorage::Sparse48;
      *num_nvfp4 += ps.storage == ExpertStorage::Nvfp4;
      r.bytes += ps.bytes;
      ++r.count;
    }
    // Some experts of the layer stored and others not: config.json claims experts the files lack.
    MOESQ_CHECK(present == 0 || first_missing < 0, ck.dir(), ": config.json says num_experts = ", s.num_experts,
                " but layer ", l, " stores ", present, " of them (no ", expert_tensor_prefix(s, l, first_missing, p),
                " tensor)");
  }
  if (r.count)
    r.bits_per_weight =
        8.0 * static_cast<double>(r.bytes) / static_cast<double>(s.moe_intermediate_size * s.hidden_size * r.count);
  return r;
}

}  // namespace

CheckpointInspection inspect_checkpoint(const std::string& dir, bool allow_mixed) {
  const Checkpoint ck(dir);
  check_config_against_tensors(ck);  // before any count or loop sized by config.json
  CheckpointInspection r;
  r.dir = dir;
  r.spec = ck.spec();
  const ModelSpec& s = r.spec;
  const nlohmann::json& cfg = ck.config();
  if (cfg.contains("architectures") && cfg["architectures"].is_array() && !cfg["architectures"].empty())
    r.architectures = cfg["architectures"];
  // What the config claims against what the tensors are.
  const QuantizationConfig q = read_quantization_config(ck);
  check_expert_storage(ck, q, allow_mixed);
  const ExpertStorageCensus census = census_expert_storage(ck, q);

  count_tensors(ck, r);
  for (int64_t l = 0; l < s.num_layers; ++l) r.moe_layers += s.is_moe_layer(l);
  int64_t num_sparse48 = 0, num_nvfp4 = 0;
  for (ExpertProj p : {ExpertProj::Gate, ExpertProj::Up, ExpertProj::Down}) {
    ProjectionInspection pi = inspect_projection(ck, q, p, &num_sparse48, &num_nvfp4);
    if (pi.count) r.projections.push_back(std::move(pi));
  }
  r.tensors = static_cast<int64_t>(ck.names().size());
  r.shards = static_cast<int64_t>(ck.shard_files().size());
  r.expert_projections_expected = r.moe_layers * s.num_experts * 3;
  r.expert_projections_packed = census.packed;
  r.expert_projections_dense = census.dense;
  r.expert_projections_mismatched = census.mismatches;
  r.compressed = cfg.contains("quantization_config") && !cfg["quantization_config"].is_null();
  r.expert_storage = census.mismatches ? "mixed" : census.packed ? "packed" : "dense";
  if (r.compressed) {
    r.layout = checkpoint_layout_name(q.layout);
    // The weight_scale granularity of compressed-tensors NVFP4: group 32 ([N, K/32]) is what the
    // paper's reference (IST-DASLab/MoESQ) writes for paired 4:8 experts; group 16 is moesq's
    // duplicated variant and stock dense NVFP4.
    if (q.layout == CheckpointLayout::CtNvfp4 || q.layout == CheckpointLayout::CtPairBitmask)
      r.layout += q.scale_group == 32 ? " group_size 32 (reference layout)" : " group_size 16";
    // What eval / generate run with (the loader's rule, io::deployed_act_block).
    r.activations = q.act_quant && q.storage != ExpertStorage::Int4
                        ? "nvfp4 block " + std::to_string(deployed_act_block(q, num_sparse48, num_nvfp4)) +
                              (q.act_static ? ", static input_global_scale" : "")
                        : "none (weight-only)";
    if (q.layout == CheckpointLayout::CtInt4) r.weight_group = q.weight_group;
    r.quantization_config = cfg["quantization_config"];
  }
  // Tensors compression never replaces (routers, shared experts, dense MLP layers, attention, ...).
  r.not_compressed = not_compressed_summary(ck);
  return r;
}

}  // namespace moesq::io
