// The expert-storage census behind `inspect` and the half-compressed rule (io/compressed_checkpoint.h),
// on small generated checkpoints: its work is bounded by the tensors present, not by what config.json
// claims (a config with 10^9 experts hung it: found by fuzz/fuzz_compressed.cpp), and the first
// mismatch is the first in (layer, expert, projection) order even where name order differs
// ("layers.10" sorts before "layers.2").
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace moesq::io;

namespace {

// config.json of the embedded model with `layers` layers and `experts` experts, plus the given tensors
// (each [4, 4] bf16 zeros or a packed-looking U8 [4, 2]).
void write_checkpoint(const fs::path& dir, int64_t layers, int64_t experts, bool quantized,
                      const std::vector<std::string>& tensors) {
  fs::create_directories(dir);
  std::ifstream in(fs::path(MOESQ_DEFAULT_MODEL) / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["num_hidden_layers"] = layers;
  cfg["num_local_experts"] = experts;
  if (quantized) cfg["quantization_config"] = quantization_config_json(false, "rtn");
  std::ofstream(dir / "config.json") << cfg.dump();
  SafetensorsWriter w;
  const std::vector<uint8_t> zeros(32, 0);
  for (const std::string& name : tensors) {
    if (name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0) w.add(name, DType::BF16, {4, 4}, zeros.data(), 32);
    else w.add(name, DType::U8, {4, 2}, zeros.data(), 8);
  }
  w.write((dir / "model.safetensors").string());
}

// The embedded model's names (qwen3_moe): "model.layers.{l}.mlp.experts.{e}.{proj}".
std::string expert_tensor_prefix(int64_t layer, int64_t expert, ExpertProj proj) {
  ModelSpec qwen;
  qwen.model_type = "qwen3_moe";
  return moesq::io::expert_tensor_prefix(qwen, layer, expert, proj);
}

}  // namespace

TEST(ExpertCensus, AConfigClaimingBillionsOfExpertsCostsNothing) {
  moesq::test::TempDir tmp("moesq_test_census");
  // Billions are refused when config.json is read (io::kMaxConfigLayers / kMaxConfigExperts) ...
  write_checkpoint(tmp.path, 2000000000, 1000000000, true, {expert_tensor_prefix(1, 5, ExpertProj::Up) + kWeight});
  EXPECT_THROW(Checkpoint(tmp.path.string()), moesq::Error);
  // ... and the census over the largest config accepted walks the tensors, not layers × experts.
  fs::remove_all(tmp.path);
  fs::create_directories(tmp.path);
  const std::string p = expert_tensor_prefix(0, moesq::io::kMaxConfigExperts - 1, ExpertProj::Gate);
  write_checkpoint(tmp.path, moesq::io::kMaxConfigLayers, moesq::io::kMaxConfigExperts, true,
                   {p + kWeightPacked, expert_tensor_prefix(1, 5, ExpertProj::Up) + kWeight});
  const Checkpoint ck(tmp.path.string());
  const auto t0 = std::chrono::steady_clock::now();
  const ExpertStorageCensus c = census_expert_storage(ck, read_quantization_config(ck));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.0) << "the census walked the config's layers × experts";
  EXPECT_EQ(c.packed, 1);
  EXPECT_EQ(c.dense, 1);
  EXPECT_EQ(c.mismatches, 1);
  EXPECT_EQ(c.first_mismatch, expert_tensor_prefix(1, 5, ExpertProj::Up) + kWeight);
}

TEST(ExpertCensus, FirstMismatchIsInLayerExpertProjOrder) {
  moesq::test::TempDir tmp("moesq_test_census");
  // Dense config: every packed projection disagrees; the first is layer 2 (numerically), not 10.
  write_checkpoint(tmp.path, 12, 4, false,
                   {expert_tensor_prefix(10, 0, ExpertProj::Gate) + kWeightPacked,
                    expert_tensor_prefix(2, 3, ExpertProj::Down) + kWeightPacked,
                    expert_tensor_prefix(2, 3, ExpertProj::Up) + kWeightSparsePacked,
                    expert_tensor_prefix(2, 1, ExpertProj::Gate) + kWeight,
                    expert_tensor_prefix(2, 7, ExpertProj::Gate) + kWeightPacked,    // expert ≥ E: not counted
                    expert_tensor_prefix(12, 0, ExpertProj::Gate) + kWeightPacked,   // layer ≥ L: not counted
                    "model.layers.2.mlp.experts.3.gate_proj.weight_scale"});         // not a storage tensor
  const Checkpoint ck(tmp.path.string());
  const QuantizationConfig q = read_quantization_config(ck);
  const ExpertStorageCensus c = census_expert_storage(ck, q);
  EXPECT_EQ(c.packed, 3);
  EXPECT_EQ(c.dense, 1);
  EXPECT_EQ(c.mismatches, 3);
  EXPECT_EQ(c.first_mismatch, expert_tensor_prefix(2, 3, ExpertProj::Up) + kWeightPacked);
  try {
    check_expert_storage(ck, q, false);
    ADD_FAILURE() << "a half-compressed checkpoint passed";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find(c.first_mismatch), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_expert_storage(ck, q, true));
}
