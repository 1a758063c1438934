// `moesq inspect DIR [--json]` — what a checkpoint holds (io::inspect_checkpoint counts it: sizes,
// tensor and shard counts, logical parameter counts, routed-expert storage per projection, a dtype
// histogram). This file only parses the arguments and prints the census, as text or one JSON object.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/inspect_checkpoint.h"

namespace moesq::cli {

namespace {

struct InspectOptions {
  std::string dir;
  bool json = false;
  bool allow_mixed = false;
};

nlohmann::json to_json(const io::CheckpointInspection& r) {
  const io::ModelSpec& s = r.spec;
  nlohmann::json out;
  out["dir"] = r.dir;
  out["architecture"] = s.model_type;
  if (r.architectures) out["architectures"] = *r.architectures;
  out["layers"] = s.num_layers;
  out["moe_layers"] = r.moe_layers;
  out["experts"] = s.num_experts;
  out["top_k"] = s.top_k;
  out["hidden_size"] = s.hidden_size;
  out["moe_intermediate_size"] = s.moe_intermediate_size;
  out["intermediate_size"] = s.intermediate_size;
  out["vocab_size"] = s.vocab_size;
  out["attention_heads"] = s.num_heads;
  out["kv_heads"] = s.num_kv_heads;
  out["head_dim"] = s.head_dim;
  if (s.mla.kv_lora_rank > 0)  // multi-head latent attention: the dims, and the latent KV cache's bf16 bytes
    out["mla"] = {{"q_lora_rank", s.mla.q_lora_rank},
                  {"kv_lora_rank", s.mla.kv_lora_rank},
                  {"qk_nope_head_dim", s.mla.qk_nope_head_dim},
                  {"qk_rope_head_dim", s.mla.qk_rope_head_dim},
                  {"v_head_dim", s.mla.v_head_dim},
                  {"rope_type", s.mla.rope.type},
                  {"kv_cache_bytes_per_token_per_layer", 2 * (s.mla.kv_lora_rank + s.mla.qk_rope_head_dim)}};
  out["tensors"] = r.tensors;
  out["shards"] = r.shards;
  out["expert_projections"] = r.expert_projections;
  out["expert_projections_expected"] = r.expert_projections_expected;
  out["expert_projections_packed"] = r.expert_projections_packed;
  out["expert_projections_dense"] = r.expert_projections_dense;
  if (r.expert_projections_mismatched) out["expert_projections_mismatched"] = r.expert_projections_mismatched;
  if (r.other_expert_tensors) out["other_expert_tensors"] = r.other_expert_tensors;
  const io::ParameterCounts& p = r.parameters;
  out["parameters"] = {{"total", p.total},
                       {"routed_experts", p.routed_experts},
                       {"non_expert", p.non_expert},
                       {"expert_share", p.expert_share},
                       {"active_per_token", p.active_per_token}};
  out["bytes"] = {{"total", r.non_expert_bytes + r.expert_bytes},
                  {"routed_experts", r.expert_bytes},
                  {"non_expert", r.non_expert_bytes}};
  out["expert_bits_per_weight"] = r.expert_bits_per_weight;
  out["compressed"] = r.compressed;
  out["expert_storage"] = r.expert_storage;
  nlohmann::json projections = nlohmann::json::object();
  for (const io::ProjectionInspection& pi : r.projections)
    projections[pi.name] = {{"count", pi.count},
                            {"shape", {pi.N, pi.K}},
                            {"storage", pi.storage},
                            {"bytes", pi.bytes},
                            {"bits_per_weight", pi.bits_per_weight}};
  out["projections"] = projections;
  if (r.compressed) {
    out["layout"] = r.layout;
    out["activations"] = r.activations;
    if (r.weight_group) out["weight_group"] = *r.weight_group;
    out["quantization_config"] = r.quantization_config;
  }
  nlohmann::json hist = nlohmann::json::object();
  for (const auto& [name, cb] : r.dtypes) hist[name] = {{"tensors", cb.first}, {"bytes", cb.second}};
  out["dtypes"] = hist;
  out["not_compressed"] = r.not_compressed;
  return out;
}

std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

void print_text(const io::CheckpointInspection& r) {
  const io::ModelSpec& s = r.spec;
  const io::ParameterCounts& p = r.parameters;
  auto ll = [](int64_t v) { return static_cast<long long>(v); };
  std::printf("checkpoint      %s\n", r.dir.c_str());
  std::printf("architecture    %s", s.model_type.c_str());
  if (r.architectures) std::printf(" (%s)", dump((*r.architectures)[0]).c_str());
  std::printf("\nlayers          %lld (%lld MoE)\n", ll(s.num_layers), ll(r.moe_layers));
  std::printf("experts         %lld routed, top-%lld\n", ll(s.num_experts), ll(s.top_k));
  std::printf("hidden / expert %lld / %lld (dense MLP %lld), vocab %lld\n", ll(s.hidden_size),
              ll(s.moe_intermediate_size), ll(s.intermediate_size), ll(s.vocab_size));
  if (s.mla.kv_lora_rank > 0)
    std::printf("attention       MLA, %lld heads, q_lora %lld, kv_lora %lld, nope / rope / v %lld / %lld / %lld (%s "
                "RoPE); latent KV cache %lld B per token per layer\n",
                ll(s.num_heads), ll(s.mla.q_lora_rank), ll(s.mla.kv_lora_rank), ll(s.mla.qk_nope_head_dim),
                ll(s.mla.qk_rope_head_dim), ll(s.mla.v_head_dim), s.mla.rope.type.c_str(),
                ll(2 * (s.mla.kv_lora_rank + s.mla.qk_rope_head_dim)));
  else
    std::printf("attention       %lld heads, %lld KV heads, head_dim %lld\n", ll(s.num_heads), ll(s.num_kv_heads),
                ll(s.head_dim));
  std::printf("tensors         %lld in %lld shard(s); %lld of %lld expert projections (%lld packed, %lld dense)\n",
              ll(r.tensors), ll(r.shards), ll(r.expert_projections), ll(r.expert_projections_expected),
              ll(r.expert_projections_packed), ll(r.expert_projections_dense));
  std::printf("parameters      %lld total, %lld routed experts (%.2f %%), %lld active per token\n", ll(p.total),
              ll(p.routed_experts), 100.0 * p.expert_share, ll(p.active_per_token));
  std::printf("expert storage  %.3f bits/weight (%llu bytes)\n", r.expert_bits_per_weight,
              static_cast<unsigned long long>(r.expert_bytes));
  if (r.expert_storage == "mixed") {
    std::printf("compressed      MIXED: %lld projections disagree with quantization_config %s\n",
                ll(r.expert_projections_mismatched), r.compressed ? dump(r.quantization_config).c_str() : "(none)");
  } else if (r.compressed) {
    std::printf("compressed      yes: layout %s, activations %s", r.layout.c_str(), r.activations.c_str());
    if (r.weight_group) std::printf(", weight group %lld", ll(*r.weight_group));
    std::printf(" (--json: the full quantization_config)\n");
  } else {
    std::printf("compressed      no\n");
  }
  std::vector<const io::ProjectionInspection*> by_name;  // the JSON object's (sorted) key order
  for (const io::ProjectionInspection& pi : r.projections) by_name.push_back(&pi);
  std::sort(by_name.begin(), by_name.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (const io::ProjectionInspection* pi : by_name) {
    std::printf("%-15s %lld x [%lld, %lld]:", pi->name.c_str(), ll(pi->count), ll(pi->N), ll(pi->K));
    for (const auto& [kind, n] : pi->storage) std::printf(" %lld %s", ll(n), kind.c_str());
    std::printf(" (%.3f bits/weight)\n", pi->bits_per_weight);
  }
  const nlohmann::json& nc = r.not_compressed;
  std::printf("not compressed  routers %lld (+%lld biases), shared experts %lld tensors (+%lld gates), dense MLP layers %s\n",
              nc["router"].get<long long>(), nc["router_bias"].get<long long>(), nc["shared_expert"].get<long long>(),
              nc["shared_expert_gate"].get<long long>(), nc["dense_mlp_layers"].dump().c_str());
  if (nc.value("copied_expert", 0) > 0)
    std::printf("not run         %lld routed-expert tensors of layers the model does not run (e.g. multi-token "
                "prediction), kept as stored\n", nc["copied_expert"].get<long long>());
  std::printf("dtypes         ");
  for (const auto& [name, cb] : r.dtypes)
    std::printf(" %s: %lld tensors (%llu bytes);", name.c_str(), ll(cb.first), static_cast<unsigned long long>(cb.second));
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
    const io::CheckpointInspection r = io::inspect_checkpoint(opt->dir, opt->allow_mixed);
    if (opt->json) {
      std::cout << to_json(r).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
    } else {
      print_text(r);
    }
  });
}

}  // namespace moesq::cli
