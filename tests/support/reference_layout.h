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
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors.h"

namespace moesq::test {

// UE4M3 byte ·2 (exact when the exponent field stays ≤ 14) and /2 (exact when no mantissa bit is lost).
inline uint8_t ue4m3_double(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 0) return static_cast<uint8_t>(m < 4 ? 2 * m : (1 << 3) | (2 * m - 8));
  return static_cast<uint8_t>(((e + 1) << 3) | m);
}
inline uint8_t ue4m3_half(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e >= 2) return static_cast<uint8_t>(((e - 1) << 3) | m);
  if (e == 1) return static_cast<uint8_t>((8 + m) / 2);  // subnormal (8 + m)/2 · 2^-9
  return static_cast<uint8_t>(m / 2);
}
inline bool ue4m3_doubles_exactly(uint8_t b) { return ((b >> 3) & 15) <= 14 && !(b & 0x80); }
inline bool ue4m3_halves_exactly(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  return !(b & 0x80) && (e >= 2 || m % 2 == 0);
}
// +1: double this up_proj's γ and block scales, −1: halve them, 0: neither is exact.
inline int up_shift(const io::SafetensorsFile& src, const std::string& prefix) {
  const std::string sn = prefix + ".weight_scale";
  if (!src.has(sn) || src.get(sn).dtype != io::DType::F8_E4M3) return 0;
  const io::TensorView& t = src.get(sn);
  const uint8_t* p = static_cast<const uint8_t*>(t.data);
  bool dbl = true, half = true;
  for (size_t i = 0; i < t.nbytes; ++i) dbl = dbl && ue4m3_doubles_exactly(p[i]), half = half && ue4m3_halves_exactly(p[i]);
  return dbl ? 1 : half ? -1 : 0;
}

// separate_up_gamma: gate and up of an expert get DIFFERENT global scales, as the reference's own
// checkpoints have, without changing any weight: an up_proj whose UE4M3 block scales can all be doubled
// exactly (none ≥ 256) gets γ·2 and every block scale ·2; else one whose block scales can all be halved
// exactly gets γ/2 and scales /2; else it stays as it was. w = q·s/γ is then bitwise the same everywhere,
// so every path must give the source's numbers exactly — and would not if it decoded up with the gate's γ.
// Returns the number of up projections whose γ changed (compressed-tensors storage only: `weight_scale`).
inline int write_reference_layout(const std::string& src_dir, const std::string& out_dir, int64_t num_layers,
                                  bool separate_up_gamma = false) {
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
  std::vector<std::shared_ptr<std::vector<uint8_t>>> kept;
  int changed = 0;
  for (const std::string& name : src.names()) {
    const io::TensorView& t = src.get(name);
    std::smatch m;
    const int64_t shard = std::regex_search(name, m, layer_re) ? std::stoll(m[1].str()) + 1 : 0;
    const bool igs = name.size() > 19 && name.compare(name.size() - 19, 19, ".input_global_scale") == 0;
    const std::string up_gs = ".up_proj.weight_global_scale", up_s = ".up_proj.weight_scale";
    auto ends = [&](const std::string& suf) {
      return name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    const std::string prefix = ends(up_gs) ? name.substr(0, name.size() - 20) : ends(up_s) ? name.substr(0, name.size() - 13) : "";
    const int k = separate_up_gamma && !prefix.empty() ? up_shift(src, prefix) : 0;
    if (igs) {
      w[shard].add(name, io::DType::F32, {}, &one, sizeof one);
      total += sizeof one;
    } else if (k != 0) {
      auto v = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(t.data),
                                                      static_cast<const uint8_t*>(t.data) + t.nbytes);
      if (ends(up_gs)) {
        MOESQ_CHECK(t.dtype == io::DType::F32, name, ": expected F32");
        for (size_t i = 0; i + 4 <= v->size(); i += 4) {
          float f;
          std::memcpy(&f, v->data() + i, 4);
          f = k > 0 ? f * 2.0f : f * 0.5f;
          std::memcpy(v->data() + i, &f, 4);
        }
        ++changed;
      } else {
        for (uint8_t& b : *v) b = k > 0 ? ue4m3_double(b) : ue4m3_half(b);
      }
      kept.push_back(v);  // the writer keeps a pointer until write()
      w[shard].add(name, t.dtype, t.shape, v->data(), t.nbytes);
      total += t.nbytes;
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
  return changed;
}

}  // namespace moesq::test
