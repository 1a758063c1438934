// A generator of the paper's reference checkpoint layout (IST-DASLab/MoESQ, as its save_model.py and
// its vLLM `paired48_nvfp4` backend read it), written from reading that code, for tests: it takes a
// `moesq export --format compressed-tensors|moesq-pair-bitmask` directory written at the default
// group 32 and rewrites it as the reference writes its own checkpoints:
//  * one safetensors shard per decoder layer plus shard 0 for everything outside the layers
//    (model-0000{i+1}-of-0000{L+1}.safetensors) and model.safetensors.index.json (metadata.total_size,
//    weight_map);
//  * input_global_scale a 0-d F32 tensor of 1.0 (the reference's dynamic "local" activations);
//  * quantization_config with the reference's field set: one group_0 targeting "Linear", weights and
//    input_activations group_size 32 (observer, scale_dtype fields as it writes them), an ignore list
//    of `re:` patterns, and the paired48_sparse marker kept when the source has it.
// Tensor bytes other than input_global_scale are copied unchanged, so the weights are the same.
#pragma once
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace moesq::test {

inline void write_reference_layout(const std::string& src_dir, const std::string& out_dir, int64_t num_layers) {
  namespace fs = std::filesystem;
  using nlohmann::json;
  fs::create_directories(out_dir);
  const io::SafetensorsFile src((fs::path(src_dir) / "model.safetensors").string());
  const int64_t shards = num_layers + 1;
  auto shard_name = [&](int64_t i) {
    char b[64];
    std::snprintf(b, sizeof b, "model-%05lld-of-%05lld.safetensors", static_cast<long long>(i + 1),
                  static_cast<long long>(shards));
    return std::string(b);
  };
  std::map<int64_t, io::SafetensorsWriter> w;
  json weight_map = json::object();
  uint64_t total = 0;
  const std::regex layer_re(R"(\.layers\.(\d+)\.)");
  const float one = 1.0f;
  for (const std::string& name : src.names()) {
    const io::TensorView& t = src.get(name);
    std::smatch m;
    const int64_t shard = std::regex_search(name, m, layer_re) ? std::stoll(m[1].str()) + 1 : 0;
    const bool igs = name.size() > 19 && name.compare(name.size() - 19, 19, ".input_global_scale") == 0;
    if (igs) {
      w[shard].add(name, io::DType::F32, {}, &one, sizeof one);
      total += sizeof one;
    } else {
      w[shard].add(name, t.dtype, t.shape, t.data, t.nbytes);
      total += t.nbytes;
    }
    weight_map[name] = shard_name(shard);
  }
  for (auto& [i, sw] : w) sw.write((fs::path(out_dir) / shard_name(i)).string());
  std::ofstream((fs::path(out_dir) / "model.safetensors.index.json"))
      << json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2);

  json cfg = json::parse(std::ifstream(fs::path(src_dir) / "config.json"));
  const json& old = cfg["quantization_config"];
  auto args = [](bool input) {
    json a = {{"num_bits", 4},  {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 32},
              {"symmetric", true}, {"observer_kwargs", json::object()}, {"scale_dtype", "torch.float8_e4m3fn"}};
    if (input) {
      a["dynamic"] = "local";
      a["observer"] = "static_minmax";
      a["zp_dtype"] = "torch.float8_e4m3fn";
    } else {
      a["dynamic"] = false;
      a["observer"] = "memoryless_minmax";
    }
    return a;
  };
  json qc = {{"quant_method", "compressed-tensors"},
             {"config_groups",
              {{"group_0",
                {{"input_activations", args(true)},
                 {"output_activations", nullptr},
                 {"targets", {"Linear"}},
                 {"weights", args(false)}}}}},
             {"format", "nvfp4-pack-quantized"},
             {"ignore",
              {"lm_head", "re:.*embed_tokens.*", "re:.*self_attn.*", "re:.*input_layernorm.*",
               "re:.*post_attention_layernorm.*", "re:.*\\.norm$", "re:.*mlp\\.gate$"}},
             {"quantization_status", "compressed"}};
  if (old.contains("paired48_sparse")) qc["paired48_sparse"] = old["paired48_sparse"];
  cfg["quantization_config"] = qc;
  std::ofstream(fs::path(out_dir) / "config.json") << cfg.dump(2);
  for (const auto& e : fs::directory_iterator(src_dir)) {
    const std::string fn = e.path().filename().string();
    if (e.is_regular_file() && fn != "config.json" && fn != "model.safetensors" && fn != "export.json")
      fs::copy_file(e.path(), fs::path(out_dir) / fn, fs::copy_options::overwrite_existing);
  }
}

}  // namespace moesq::test
