// A checkpoint with a real (non-byte) vocabulary for tokenizer-wiring tests: the tiny byte-level model
// with embed_tokens and lm_head grown to the tokenizer's V rows (row r = bf16(row r mod 256 ·
// (1 − 0.05·⌊r/256⌋)), so every id has its own logit), config.json vocab_size = V, and the given
// tokenizer.json copied in. Other tensors are copied unchanged.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "io/checkpoint.h"
#include "io/tensor_names.h"

namespace moesq::test {

inline void write_tokenizer_checkpoint(const io::Checkpoint& src, const std::string& dir, int64_t V,
                                       const std::string& tokenizer_json) {
  std::filesystem::create_directories(dir);
  io::SafetensorsWriter w;
  for (const std::string& name : src.names()) {
    const io::TensorView& t = src.get(name);
    if (name != io::kEmbedTokens && name != io::kLmHead) {
      w.add(name, t.dtype, t.shape, t.data, t.nbytes);
      continue;
    }
    const int64_t rows = t.shape[0], H = t.shape[1];
    const std::vector<float> x = io::to_f32(t);
    std::vector<uint16_t> grown(static_cast<size_t>(V * H));  // [V, H] bf16
    for (int64_t r = 0; r < V; ++r)
      for (int64_t h = 0; h < H; ++h)
        grown[r * H + h] = f32_to_bf16(x[(r % rows) * H + h] * (1.0f - 0.05f * static_cast<float>(r / rows)));
    w.add(name, io::DType::BF16, {V, H}, grown.data(), grown.size() * 2);
  }
  io::write_checkpoint_tensors(dir, w);
  nlohmann::json cfg = src.config();
  cfg["vocab_size"] = V;
  std::ofstream(std::filesystem::path(dir) / "config.json") << cfg.dump(2);
  if (!tokenizer_json.empty())
    std::filesystem::copy_file(tokenizer_json, std::filesystem::path(dir) / "tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
}

}  // namespace moesq::test
