// Test support: a Qwen3.5-MoE checkpoint in the hub layout (io/hub_layout.h), built from a flat
// per-expert fixture: config.json = the multimodal wrapper (model_type qwen3_5_moe, the fixture's
// config as text_config), the text model's tensors renamed under "model.language_model.", the
// routed experts FUSED per layer into gate_up_proj [E, 2I, H] (gate rows first) and down_proj
// [E, H, I], and two tensors that are not the text model's (a vision weight, an MTP weight) which
// must travel byte-identical. Written with io::SafetensorsWriter in shards of `max_shard_bytes`.
#pragma once
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"

namespace moesq::test {

// Tensors of the wrapper that are not the text model's.
inline const std::vector<std::string>& hub_extra_tensors() {
  static const std::vector<std::string> names = {"model.visual.patch_embed.proj.weight", "mtp.fc.weight"};
  return names;
}

struct HubEdits {
  // Called on the wrapper config.json before it is written (break it for error tests).
  std::function<void(nlohmann::json&)> config;
  // Extra rows added to layer 0's fused gate_up_proj (a wrong shape for error tests).
  int64_t extra_gate_up_rows = 0;
  // Also store layer 0 expert 0's gate_proj per expert (a duplicate of the fused slice).
  bool duplicate_expert = false;
  // Store the text model's tensors under "model." (no "model.language_model." nesting).
  bool no_prefix = false;
};

inline void write_hub_checkpoint(const io::Checkpoint& src, const std::string& dir, const HubEdits& edits = {},
                                 size_t max_shard_bytes = size_t(1) << 20) {
  const io::ModelSpec& s = src.spec();
  const int64_t E = s.num_experts, H = s.hidden_size, I = s.moe_intermediate_size;
  io::SafetensorsWriter w;
  const std::string text_prefix = edits.no_prefix ? "model." : "model.language_model.";
  auto hub = [&](const std::string& n) { return n.rfind("model.", 0) == 0 ? text_prefix + n.substr(6) : n; };
  for (const std::string& n : src.names()) {
    if (io::is_expert_tensor(n)) continue;
    const io::TensorView& t = src.get(n);
    w.add(hub(n), t.dtype, t.shape, t.data, t.nbytes);
  }
  for (int64_t l = 0; l < s.num_layers; ++l) {
    if (!s.is_moe_layer(l)) continue;
    const io::TensorView& g0 = src.get(io::expert_tensor_prefix(s, l, 0, io::ExpertProj::Gate) + io::kWeight);
    const size_t es = io::dtype_size(g0.dtype), blk = static_cast<size_t>(I * H) * es;
    const int64_t extra = l == 0 ? edits.extra_gate_up_rows : 0;
    std::vector<uint8_t> gate_up, down;  // [E, 2I (+extra), H], [E, H, I]
    for (int64_t e = 0; e < E; ++e) {
      for (io::ExpertProj p : {io::ExpertProj::Gate, io::ExpertProj::Up}) {
        const io::TensorView& t = src.get(io::expert_tensor_prefix(s, l, e, p) + io::kWeight);
        gate_up.insert(gate_up.end(), t.data, t.data + blk);
      }
      gate_up.resize(gate_up.size() + static_cast<size_t>(extra * H) * es, 0);
      const io::TensorView& d = src.get(io::expert_tensor_prefix(s, l, e, io::ExpertProj::Down) + io::kWeight);
      down.insert(down.end(), d.data, d.data + blk);
    }
    const std::string base = text_prefix + "layers." + std::to_string(l) + ".mlp.experts.";
    w.add(base + "gate_up_proj", g0.dtype, {E, 2 * I + extra, H}, gate_up.data(), gate_up.size());
    w.add(base + "down_proj", g0.dtype, {E, H, I}, down.data(), down.size());
    if (l == 0 && edits.duplicate_expert) w.add(base + "0.gate_proj.weight", g0.dtype, {I, H}, g0.data, g0.nbytes);
  }
  const std::vector<float> vis = {0.5f, -1.25f, 2.0f, 0.125f, 3.0f, -0.75f};  // [2, 3], [3, 2]
  w.add_f32(hub_extra_tensors()[0], {2, 3}, vis);
  w.add_f32(hub_extra_tensors()[1], {3, 2}, vis);
  io::write_checkpoint_tensors(dir, w, max_shard_bytes);

  nlohmann::json text = src.config();
  text.erase("architectures");
  const nlohmann::json tie = text.contains("tie_word_embeddings") ? text["tie_word_embeddings"] : nlohmann::json(false);
  text.erase("tie_word_embeddings");
  nlohmann::json cfg = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
                        {"model_type", "qwen3_5_moe"},
                        {"text_config", text},
                        {"tie_word_embeddings", tie},
                        {"vision_config", {{"model_type", "qwen3_5_moe"}, {"depth", 1}, {"hidden_size", 3}}},
                        {"image_token_id", 248056}};
  if (edits.config) edits.config(cfg);
  std::ofstream(dir + "/config.json") << cfg.dump(2) << "\n";
}

}  // namespace moesq::test
