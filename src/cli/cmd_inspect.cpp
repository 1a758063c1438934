// `moesq inspect DIR [--json]` — what a checkpoint holds: architecture and sizes from config.json,
// tensor and shard counts, parameter counts (total, routed experts, their share), whether the routed
// experts are compressed, and a dtype histogram.
// Non-obvious decision: parameters are LOGICAL weights, so the same model reports the same counts
// before and after compression. A dense tensor counts its numel; a compressed expert projection
// (`P.weight_packed`, docs/FORMAT.md) counts the N×K of the dense weight it replaces, taken
// from the config; its scales and sparsity metadata count as bytes, not parameters. The measured
// bits per routed-expert weight (stored bytes × 8 / logical weights) then reads 16 for bf16 experts
// and ~2.75 for paired 4:8 NVFP4. The per-projection section reports what each projection's tensors
// HOLD (io::read_projection_storage reads and validates them: a compressed-tensors NVFP4 tensor is
// called paired 4:8 only when its data is), not what the config claims.
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "io/import_checkpoint.h"
#include "io/tensor_names.h"

namespace moesq::cli {

namespace {

struct InspectOptions {
  std::string dir;
  bool json = false;
  bool allow_mixed = false;
};

// Logical [N, K] of one routed-expert projection (PyTorch Linear layout: [out, in]).
int64_t expert_projection_numel(const io::ModelSpec& s, const std::string& proj, const std::string& tensor) {
  if (const std::optional<io::ExpertProj> p = io::expert_proj_of(proj)) return s.moe_intermediate_size * s.hidden_size;
  MOESQ_FAIL("tensor ", tensor, ": unknown expert projection \"", proj, "\"");
}

bool is_plain_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;  // Mixtral: w1
  return true;
}

nlohmann::json inspect(const std::string& dir, bool allow_mixed) {
  const io::Checkpoint ck(dir);
  const io::ModelSpec& s = ck.spec();
  // What the config claims against what the tensors are: a half-compressed checkpoint is an error
  // naming the first mismatching tensor unless --allow-mixed, and then reported as "mixed".
  const io::QuantizationConfig q = io::read_quantization_config(ck);
  io::check_expert_storage(ck, q, allow_mixed);
  const io::ExpertStorageCensus census = io::census_expert_storage(ck, q);

  int64_t non_expert_params = 0, expert_params = 0;
  uint64_t non_expert_bytes = 0, expert_bytes = 0;
  int64_t expert_projections = 0, other_expert_tensors = 0;
  std::map<std::string, std::pair<int64_t, uint64_t>> dtypes;  // name → (tensors, bytes)
  for (const std::string& name : ck.names()) {
    const io::TensorView& t = ck.get(name);
    auto& [count, bytes] = dtypes[io::dtype_name(t.dtype)];
    ++count;
    bytes += t.nbytes;
    if (!io::in_expert_container(name)) {
      non_expert_params += t.numel();
      non_expert_bytes += t.nbytes;
      continue;
    }
    expert_bytes += t.nbytes;
    if (io::is_fused_expert_weight(name)) {  // all experts of a layer in one [E, ·, ·] tensor (gpt-oss)
      expert_params += t.numel();
      expert_projections += t.numel() / (s.moe_intermediate_size * s.hidden_size);  // gate_up: 2E, down: E
      continue;
    }
    if (io::tensor_role(s, name) == io::TensorRole::ExpertBias) {  // expert biases: kept as stored
      expert_params += t.numel();
      continue;
    }
    // model.layers.{l}.mlp.experts.{e}.{proj}.{suffix}, proj and suffix plain [a-z_]+ names
    const std::optional<io::ExpertTensorName> m = io::parse_expert_tensor(name);
    const bool plain = m && is_plain_name(m->proj) && is_plain_name(m->suffix);
    if (plain && m->suffix == "weight") {
      expert_params += t.numel();  // dense expert weight
      ++expert_projections;
    } else if (plain && ("." + m->suffix == io::kWeightPacked || "." + m->suffix == io::kWeightSparsePacked)) {
      expert_params += expert_projection_numel(s, m->proj, name);
      ++expert_projections;
    } else if (!plain) {
      expert_params += t.numel();  // some other expert layout (e.g. fused): numel is all we know
      ++other_expert_tensors;
    }
    // else: scales / metadata of a compressed projection — bytes only.
  }
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < s.num_layers; ++l) moe_layers += s.is_moe_layer(l);
  // Per projection (gate_proj, up_proj, down_proj): storage found in the tensors, bytes, bits/weight.
  nlohmann::json projections = nlohmann::json::object();
  int64_t num_sparse48 = 0, num_nvfp4 = 0;
  for (const char* proj : io::kExpertProjNames) {
    const int64_t numel = expert_projection_numel(s, proj, proj);
    const bool down = std::string(proj) == "down_proj";
    const int64_t N = down ? s.hidden_size : s.moe_intermediate_size, K = down ? s.moe_intermediate_size : s.hidden_size;
    std::map<std::string, int64_t> kinds;
    uint64_t bytes = 0;
    int64_t count = 0;
    const io::LayerTensorNames& names = io::layer_tensor_names(s.model_type);
    const char* fused = down ? names.fused_down : names.fused_gate_up;
    for (int64_t l = 0; l < s.num_layers; ++l) {
      if (!s.is_moe_layer(l)) continue;
      if (fused && ck.has(io::layer_tensor(l, fused))) {  // one dense tensor for the layer (gate_up: half each)
        const io::TensorView& t = ck.get(io::layer_tensor(l, fused));
        kinds[io::expert_storage_name(io::ExpertStorage::Dense)] += s.num_experts;
        bytes += down ? t.nbytes : t.nbytes / 2;
        count += s.num_experts;
        continue;
      }
      for (int64_t e = 0; e < s.num_experts; ++e) {
        const std::string prefix = io::expert_tensor_prefix(l, e, proj);
        if (!ck.has(prefix + io::kWeight) && !io::has_packed_projection(ck, prefix)) continue;  // other layout
        const io::ProjectionStorage ps = io::read_projection_storage(ck, q, prefix, N, K);
        ++kinds[io::expert_storage_name(ps.storage)];
        num_sparse48 += ps.storage == io::ExpertStorage::Sparse48;
        num_nvfp4 += ps.storage == io::ExpertStorage::Nvfp4;
        bytes += ps.bytes;
        ++count;
      }
    }
    if (!count) continue;
    projections[proj] = {{"count", count},
                         {"shape", {N, K}},
                         {"storage", kinds},
                         {"bytes", bytes},
                         {"bits_per_weight", 8.0 * static_cast<double>(bytes) / static_cast<double>(numel * count)}};
  }
  const int64_t total = non_expert_params + expert_params;
  const double expert_share = total ? static_cast<double>(expert_params) / static_cast<double>(total) : 0.0;
  // Per token only top_k of num_experts routed experts run in each MoE layer.
  const double active = static_cast<double>(non_expert_params) +
                        static_cast<double>(expert_params) * static_cast<double>(s.top_k) /
                            static_cast<double>(s.num_experts);

  nlohmann::json out;
  out["dir"] = dir;
  out["architecture"] = s.model_type;
  if (ck.config().contains("architectures") && ck.config()["architectures"].is_array() &&
      !ck.config()["architectures"].empty()) {
    out["architectures"] = ck.config()["architectures"];
  }
  out["layers"] = s.num_layers;
  out["moe_layers"] = moe_layers;
  out["experts"] = s.num_experts;
  out["top_k"] = s.top_k;
  out["hidden_size"] = s.hidden_size;
  out["moe_intermediate_size"] = s.moe_intermediate_size;
  out["intermediate_size"] = s.intermediate_size;
  out["vocab_size"] = s.vocab_size;
  out["attention_heads"] = s.num_heads;
  out["kv_heads"] = s.num_kv_heads;
  out["head_dim"] = s.head_dim;
  out["tensors"] = ck.names().size();
  out["shards"] = ck.shard_files().size();
  out["expert_projections"] = expert_projections;
  out["expert_projections_expected"] = moe_layers * s.num_experts * 3;
  out["expert_projections_packed"] = census.packed;
  out["expert_projections_dense"] = census.dense;
  if (census.mismatches) out["expert_projections_mismatched"] = census.mismatches;
  if (other_expert_tensors) out["other_expert_tensors"] = other_expert_tensors;
  out["parameters"] = {{"total", total},
                       {"routed_experts", expert_params},
                       {"non_expert", non_expert_params},
                       {"expert_share", expert_share},
                       {"active_per_token", static_cast<int64_t>(active + 0.5)}};
  out["bytes"] = {{"total", non_expert_bytes + expert_bytes},
                  {"routed_experts", expert_bytes},
                  {"non_expert", non_expert_bytes}};
  out["expert_bits_per_weight"] =
      expert_params ? 8.0 * static_cast<double>(expert_bytes) / static_cast<double>(expert_params) : 0.0;
  const bool compressed = ck.config().contains("quantization_config") &&
                          !ck.config()["quantization_config"].is_null();
  out["compressed"] = compressed;
  out["expert_storage"] = census.mismatches ? "mixed" : census.packed ? "packed" : "dense";
  out["projections"] = projections;
  if (compressed) {
    out["layout"] = io::checkpoint_layout_name(q.layout);
    // What eval / generate run with (the loader's rule, io::deployed_act_block).
    out["activations"] = q.act_quant && q.storage != io::ExpertStorage::Int4
                             ? "nvfp4 block " + std::to_string(io::deployed_act_block(q, num_sparse48, num_nvfp4))
                             : "none (weight-only)";
    if (q.layout == io::CheckpointLayout::CtInt4) out["weight_group"] = q.weight_group;
    out["quantization_config"] = ck.config()["quantization_config"];
  }
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [name, cb] : dtypes) hist[name] = {{"tensors", cb.first}, {"bytes", cb.second}};
  out["dtypes"] = hist;
  // Tensors compression never replaces (routers, shared experts, dense MLP layers, attention, ...).
  out["not_compressed"] = io::not_compressed_summary(ck);
  return out;
}

void print_text(const nlohmann::json& r) {
  const auto& p = r["parameters"];
  std::printf("checkpoint      %s\n", r["dir"].get<std::string>().c_str());
  std::printf("architecture    %s", r["architecture"].get<std::string>().c_str());
  if (r.contains("architectures")) std::printf(" (%s)", r["architectures"][0].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  std::printf("\nlayers          %lld (%lld MoE)\n", r["layers"].get<long long>(), r["moe_layers"].get<long long>());
  std::printf("experts         %lld routed, top-%lld\n", r["experts"].get<long long>(), r["top_k"].get<long long>());
  std::printf("hidden / expert %lld / %lld (dense MLP %lld), vocab %lld\n", r["hidden_size"].get<long long>(),
              r["moe_intermediate_size"].get<long long>(), r["intermediate_size"].get<long long>(),
              r["vocab_size"].get<long long>());
  std::printf("attention       %lld heads, %lld KV heads, head_dim %lld\n", r["attention_heads"].get<long long>(),
              r["kv_heads"].get<long long>(), r["head_dim"].get<long long>());
  std::printf("tensors         %lld in %lld shard(s); %lld of %lld expert projections (%lld packed, %lld dense)\n",
              r["tensors"].get<long long>(), r["shards"].get<long long>(), r["expert_projections"].get<long long>(),
              r["expert_projections_expected"].get<long long>(), r["expert_projections_packed"].get<long long>(),
              r["expert_projections_dense"].get<long long>());
  std::printf("parameters      %lld total, %lld routed experts (%.2f %%), %lld active per token\n",
              p["total"].get<long long>(), p["routed_experts"].get<long long>(), 100.0 * p["expert_share"].get<double>(),
              p["active_per_token"].get<long long>());
  std::printf("expert storage  %.3f bits/weight (%llu bytes)\n", r["expert_bits_per_weight"].get<double>(),
              r["bytes"]["routed_experts"].get<unsigned long long>());
  if (r["expert_storage"] == "mixed") {
    std::printf("compressed      MIXED: %lld projections disagree with quantization_config %s\n",
                r["expert_projections_mismatched"].get<long long>(),
                r.contains("quantization_config") ? r["quantization_config"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str() : "(none)");
  } else if (r["compressed"].get<bool>()) {
    std::printf("compressed      yes: layout %s, activations %s", r["layout"].get<std::string>().c_str(),
                r["activations"].get<std::string>().c_str());
    if (r.contains("weight_group")) std::printf(", weight group %lld", r["weight_group"].get<long long>());
    std::printf(" (--json: the full quantization_config)\n");
  } else {
    std::printf("compressed      no\n");
  }
  for (const auto& [proj, v] : r["projections"].items()) {
    std::printf("%-15s %lld x [%lld, %lld]:", proj.c_str(), v["count"].get<long long>(), v["shape"][0].get<long long>(),
                v["shape"][1].get<long long>());
    for (const auto& [kind, n] : v["storage"].items()) std::printf(" %lld %s", n.get<long long>(), kind.c_str());
    std::printf(" (%.3f bits/weight)\n", v["bits_per_weight"].get<double>());
  }
  const auto& nc = r["not_compressed"];
  std::printf("not compressed  routers %lld (+%lld biases), shared experts %lld tensors (+%lld gates), dense MLP layers %s\n",
              nc["router"].get<long long>(), nc["router_bias"].get<long long>(), nc["shared_expert"].get<long long>(),
              nc["shared_expert_gate"].get<long long>(), nc["dense_mlp_layers"].dump().c_str());
  std::printf("dtypes         ");
  for (const auto& [name, v] : r["dtypes"].items()) {
    std::printf(" %s: %lld tensors (%llu bytes);", name.c_str(), v["tensors"].get<long long>(),
                v["bytes"].get<unsigned long long>());
  }
  std::printf("\n");
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto opt = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand(
      "inspect", "Show a checkpoint's architecture, tensor counts and routed-expert parameter share");
  cmd->add_option("dir", opt->dir, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of text");
  cmd->add_flag("--allow-mixed", opt->allow_mixed,
                "Report a half-compressed checkpoint (some expert projections dense, the rest packed) instead of failing");
  cmd->callback([opt] {
    const nlohmann::json r = inspect(opt->dir, opt->allow_mixed);
    if (opt->json) {
      std::cout << r.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    } else {
      print_text(r);
    }
  });
}

}  // namespace moesq::cli
