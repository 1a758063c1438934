// Checkpoint directories: sharded writing + index, reading back bit-identical tensors across
// shards, an index entry whose shard lacks the tensor (error naming tensor and shard), missing
// files, shape checks, and the embedded tiny model (its tensor count and parameter total must equal
// the total_parameters that transformers wrote into its index).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"

#include "support/temp_dir.h"

namespace fs = std::filesystem;
using moesq::Error;
using namespace moesq::io;

namespace {

using moesq::test::TempDir;

void copy_config(const fs::path& dir) {
  fs::copy_file(fs::path(MOESQ_DEFAULT_MODEL) / "config.json", dir / "config.json");
}

// Random tensors with assorted dtypes and sizes; returns their bytes by name.
std::map<std::string, std::vector<uint8_t>> fill(SafetensorsWriter& w, uint32_t seed, int count) {
  std::mt19937 rng(seed);
  std::map<std::string, std::vector<uint8_t>> out;
  const DType dts[] = {DType::BF16, DType::F32, DType::U8, DType::F8_E4M3};
  for (int i = 0; i < count; ++i) {
    const DType dt = dts[i % 4];
    const int64_t rows = 1 + rng() % 7, cols = 8 + rng() % 40;
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols) * dtype_size(dt));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    if (dt == DType::F32) {  // keep floats finite so that to_f32 comparisons stay meaningful
      for (size_t k = 3; k < bytes.size(); k += 4) bytes[k] &= 0x3f;
    }
    const std::string name = "model.layers." + std::to_string(i) + ".w";
    w.add(name, dt, {rows, cols}, bytes.data(), bytes.size());
    out[name] = bytes;
  }
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Checkpoint, ShardedRoundTrip) {
  TempDir dir;
  copy_config(dir.path);
  SafetensorsWriter w;
  const auto expect = fill(w, 7, 23);
  const size_t max_shard = w.data_bytes() / 4;  // forces ≥ 4 shards
  write_checkpoint_tensors(dir.path.string(), w, max_shard);
  ASSERT_TRUE(fs::exists(dir.path / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir.path / "model.safetensors"));

  const auto index = nlohmann::json::parse(std::ifstream(dir.path / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), w.data_bytes());
  EXPECT_EQ(index["weight_map"].size(), expect.size());

  Checkpoint ck(dir.path.string());
  EXPECT_GE(ck.shard_files().size(), 4u);
  for (const auto& f : ck.shard_files()) {
    EXPECT_TRUE(fs::path(f).is_absolute());
    // Each shard obeys the limit unless it holds a single oversized tensor.
    SafetensorsFile s(f);
    size_t bytes = 0;
    for (const auto& n : s.names()) bytes += s.get(n).nbytes;
    EXPECT_TRUE(bytes <= max_shard || s.names().size() == 1) << f;
    EXPECT_EQ(s.metadata().at("format"), "pt");
  }
  ASSERT_EQ(ck.names().size(), expect.size());
  for (const auto& [name, bytes] : expect) {
    const TensorView& t = ck.get(name);
    ASSERT_EQ(t.nbytes, bytes.size()) << name;
    EXPECT_EQ(std::memcmp(t.data, bytes.data(), bytes.size()), 0) << name;
  }
  EXPECT_EQ(ck.spec().num_experts, 32);
}

TEST(Checkpoint, SingleFileWhenSmall) {
  TempDir dir;
  copy_config(dir.path);
  SafetensorsWriter w;
  const auto expect = fill(w, 11, 5);
  write_checkpoint_tensors(dir.path.string(), w);  // default 2 GiB limit
  EXPECT_TRUE(fs::exists(dir.path / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir.path / "model.safetensors.index.json"));
  Checkpoint ck(dir.path.string());
  EXPECT_EQ(ck.shard_files().size(), 1u);
  EXPECT_EQ(ck.names().size(), expect.size());
}

TEST(Checkpoint, TensorMissingFromItsShard) {
  TempDir dir;
  copy_config(dir.path);
  SafetensorsWriter w;
  fill(w, 3, 12);
  write_checkpoint_tensors(dir.path.string(), w, w.data_bytes() / 3);
  const fs::path index_path = dir.path / "model.safetensors.index.json";
  auto index = nlohmann::json::parse(std::ifstream(index_path));
  // Point one tensor at a shard that does not hold it.
  const std::string victim = "model.layers.0.w";
  const std::string own = index["weight_map"][victim];
  std::string other;
  for (auto& [k, v] : index["weight_map"].items()) {
    if (v != own) other = v;
  }
  ASSERT_FALSE(other.empty());
  index["weight_map"][victim] = other;
  std::ofstream(index_path) << index.dump();
  const std::string msg = error_of([&] { Checkpoint ck(dir.path.string()); });
  EXPECT_NE(msg.find(victim), std::string::npos) << msg;
  EXPECT_NE(msg.find(other), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;

  // A shard the index names that does not exist.
  index["weight_map"][victim] = "model-00009-of-00009.safetensors";
  std::ofstream(index_path) << index.dump();
  const std::string msg2 = error_of([&] { Checkpoint ck(dir.path.string()); });
  EXPECT_NE(msg2.find("model-00009-of-00009.safetensors"), std::string::npos) << msg2;

  // A path that escapes the directory.
  index["weight_map"][victim] = "../elsewhere.safetensors";
  std::ofstream(index_path) << index.dump();
  const std::string msg3 = error_of([&] { Checkpoint ck(dir.path.string()); });
  EXPECT_NE(msg3.find("plain file name"), std::string::npos) << msg3;
}

TEST(Checkpoint, MissingPiecesNameTheDirectory) {
  TempDir dir;
  const std::string missing = (dir.path / "nope").string();
  EXPECT_NE(error_of([&] { Checkpoint ck(missing); }).find(missing), std::string::npos);
  // No config.json.
  EXPECT_NE(error_of([&] { Checkpoint ck(dir.path.string()); }).find("config.json"), std::string::npos);
  // Config but no weights.
  copy_config(dir.path);
  const std::string msg = error_of([&] { Checkpoint ck(dir.path.string()); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find(dir.path.string()), std::string::npos) << msg;
}

TEST(Checkpoint, GetChecksNameAndShape) {
  TempDir dir;
  copy_config(dir.path);
  SafetensorsWriter w;
  std::vector<float> v(6);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : v) x = u(rng);
  w.add_f32("a", {2, 3}, v);
  write_checkpoint_tensors(dir.path.string(), w);
  Checkpoint ck(dir.path.string());
  EXPECT_EQ(ck.get_f32("a", {2, 3}), v);
  const std::string msg = error_of([&] { ck.get_f32("a", {3, 2}); });
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  const std::string msg2 = error_of([&] { ck.get("b"); });
  EXPECT_NE(msg2.find("tensor b"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find(dir.path.string()), std::string::npos) << msg2;
}

TEST(Checkpoint, EmbeddedTinyModel) {
  Checkpoint ck(MOESQ_DEFAULT_MODEL);
  const auto index = nlohmann::json::parse(std::ifstream(fs::path(MOESQ_DEFAULT_MODEL) / "model.safetensors.index.json"));
  int64_t params = 0;
  size_t bytes = 0;
  for (const auto& n : ck.names()) {
    params += ck.get(n).numel();
    bytes += ck.get(n).nbytes;
  }
  EXPECT_EQ(ck.names().size(), index["weight_map"].size());
  EXPECT_EQ(params, index["metadata"]["total_parameters"].get<int64_t>());
  EXPECT_EQ(bytes, index["metadata"]["total_size"].get<size_t>());
  EXPECT_EQ(ck.shard_files().size(), 2u);
  const ModelSpec& s = ck.spec();
  const auto gate = ck.get("model.layers.0.mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(gate.shape, (std::vector<int64_t>{s.moe_intermediate_size, s.hidden_size}));
  EXPECT_EQ(gate.dtype, DType::BF16);
}
