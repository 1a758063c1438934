// A compressed-tensors `pack-quantized` INT4 checkpoint (symmetric, group G, the Kimi-K2.5 release
// format) made from a dense checkpoint by round-to-nearest, written the way compressed-tensors packs
// it (docs/FORMAT.md §10): weight_packed I32 [N, K/8] offset-8 nibbles (element k in bits 4·(k%8) of
// word k/8), weight_scale BF16 [N, K/G], weight_shape I64 [2]. Returns each projection's expected
// dequantized floats bf16(q · scale), by prefix. `edit_scale`, when given, may rewrite each
// projection's bf16 scale codes after packing (tests of bad scales).
#pragma once
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/half.h"
#include "io/checkpoint.h"
#include "io/tensor_names.h"

namespace moesq::test {

inline std::map<std::string, std::vector<float>> write_int4_checkpoint(const io::Checkpoint& src, const std::string& dir,
                                                                       int64_t G,
                                                                       const std::function<void(const std::string& prefix,
                                                                                                std::vector<uint16_t>& scale)>&
                                                                           edit_scale = {}) {
  std::filesystem::create_directories(dir);
  io::SafetensorsWriter w;
  std::map<std::string, std::vector<float>> want;
  for (const std::string& name : src.names()) {
    const io::TensorView& t = src.get(name);
    const auto parsed = io::parse_expert_tensor(name);
    if (!parsed || parsed->suffix != "weight") {
      w.add(name, t.dtype, t.shape, t.data, t.nbytes);
      continue;
    }
    const std::string prefix = name.substr(0, name.size() - 7);
    const int64_t N = t.shape[0], K = t.shape[1];
    const std::vector<float> x = io::to_f32(t);
    std::vector<int32_t> packed(static_cast<size_t>(N * K / 8), 0);
    std::vector<uint16_t> scale(static_cast<size_t>(N * K / G));
    std::vector<float>& ref = want[prefix];
    ref.resize(static_cast<size_t>(N * K));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < K / G; ++g) {
        float amax = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) amax = std::max(amax, std::fabs(x[n * K + k]));
        scale[n * K / G + g] = f32_to_bf16(amax > 0 ? amax / 7.0f : 1.0f);
        const float sc = bf16_to_f32(scale[n * K / G + g]);
        for (int64_t k = g * G; k < (g + 1) * G; ++k) {
          const int v = std::clamp(static_cast<int>(std::lround(x[n * K + k] / sc)), -8, 7);
          packed[n * K / 8 + k / 8] |= static_cast<int32_t>(static_cast<uint32_t>(v + 8) << (4 * (k % 8)));
          ref[n * K + k] = round_bf16(static_cast<float>(v) * sc);
        }
      }
    if (edit_scale) edit_scale(prefix, scale);
    const int64_t shape[2] = {N, K};
    w.add(prefix + io::kWeightPacked, io::DType::I32, {N, K / 8}, packed.data(), packed.size() * 4);
    w.add(prefix + io::kWeightScale, io::DType::BF16, {N, K / G}, scale.data(), scale.size() * 2);
    w.add(prefix + io::kWeightShape, io::DType::I64, {2}, shape, sizeof(shape));
  }
  io::write_checkpoint_tensors(dir, w);
  nlohmann::json cfg = src.config();
  cfg["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"config_groups",
       {{"group_0",
         {{"targets", {"Linear"}},
          {"weights", {{"num_bits", 4}, {"type", "int"}, {"symmetric", true}, {"strategy", "group"}, {"group_size", G}}},
          {"input_activations", nullptr}}}}},
      {"ignore", {"lm_head"}}};
  std::ofstream(std::filesystem::path(dir) / "config.json") << cfg.dump(2);
  return want;
}

}  // namespace moesq::test
