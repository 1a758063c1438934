// The paper's reference layout (IST-DASLab/MoESQ: group_size 32, weight_scale [N, K/32], 0-d
// input_global_scale, `re:` ignore entries, one shard per layer + index), made from the tiny model
// by tests/support/reference_layout.h: it evaluates to exactly the nats of the moesq checkpoint it
// came from, in dense and pair-bitmask storage; `inspect` names it; group 16 and group 32 exports of
// one checkpoint, and the reference checkpoint, convert back to byte-identical moesq checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "support/cli_run.h"
#include "support/reference_layout.h"
#include "support/temp_dir.h"

namespace {

using moesq::test::run_moesq;
using moesq::test::slurp;

class CliReferenceLayout : public ::testing::Test {
 protected:
  moesq::test::TempDir dir_{"moesq_test_cli_reference_layout"};
  const std::string model_ = MOESQ_DEFAULT_MODEL;

  void SetUp() override {
    std::ofstream t(dir_.file("text.txt"));
    for (int i = 0; i < 200; ++i) t << "def f" << i << "(x):\n    return x * " << i << " + " << (i * 7) % 13 << "\n";
  }
  std::string must(const std::string& args) {
    const moesq::test::CliRun r = run_moesq(args, dir_.path);
    EXPECT_EQ(r.rc, 0) << args << "\n" << r.err;
    return r.out;
  }
  double nats(const std::string& ckpt) {
    const std::string out = must("eval " + ckpt + " --data " + dir_.file("text.txt") + " --seq-len 64 --json");
    return out.empty() ? -1.0 : nlohmann::json::parse(out)["nats_per_token"].get<double>();
  }
};

TEST_F(CliReferenceLayout, ReferenceCheckpointsEvaluateToTheMoesqNats) {
  const std::string src = dir_.file("mag");
  must("compress " + model_ + " --method magnitude --out " + src + " --calib-samples 2 --seq-len 16");
  const double ref = nats(src);
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  const int64_t layers = cfg["num_hidden_layers"].get<int64_t>();
  for (const char* f : {"compressed-tensors", "moesq-pair-bitmask"}) {
    const std::string x32 = dir_.file(std::string("x32-") + f), x16 = dir_.file(std::string("x16-") + f);
    const nlohmann::json s = nlohmann::json::parse(must("export " + src + " --format " + f + " --out " + x32 + " --json"));
    EXPECT_EQ(s["scale_block"], 32) << f << ": group 32 is the default for paired 4:8";
    EXPECT_NEAR(s["bits_per_expert_weight"].get<double>(), std::string(f) == "compressed-tensors" ? 4.25 : 2.75, 0.01);
    must("export " + src + " --format " + f + " --out " + x16 + " --scale-block 16");
    const std::string rl = dir_.file(std::string("ref-") + f);
    moesq::test::write_reference_layout(x32, rl, layers);
    EXPECT_EQ(nats(x32), ref) << f;
    EXPECT_EQ(nats(x16), ref) << f;
    EXPECT_EQ(nats(rl), ref) << f;
    const nlohmann::json ins = nlohmann::json::parse(must("inspect " + rl + " --json"));
    EXPECT_NE(ins["layout"].get<std::string>().find("group_size 32 (reference layout)"), std::string::npos) << ins;
    EXPECT_EQ(ins["shards"], layers + 1);
    // Same dequantized weights: each converts back to the same moesq checkpoint, byte for byte.
    std::string first;
    for (const std::string& d : {x32, x16, rl}) {
      must("export " + d + " --format moesq --out " + d + "-back");
      const std::string bytes = slurp(d + "-back/model.safetensors");
      EXPECT_FALSE(bytes.empty());
      if (first.empty()) first = bytes;
      EXPECT_TRUE(bytes == first) << d;
    }
    // Round trip in the reference layout: reference → export (group 32) → export again is bit-exact.
    must("export " + rl + " --format " + f + " --out " + rl + "-again");
    must("export " + rl + "-again --format " + f + " --out " + rl + "-again2");
    EXPECT_TRUE(slurp(rl + "-again/model.safetensors") == slurp(rl + "-again2/model.safetensors")) << f;
  }
  // A dense NVFP4 source cannot be written at group 32.
  const std::string rtn = dir_.file("rtn");
  must("compress " + model_ + " --method rtn-nvfp4 --out " + rtn + " --calib-samples 2 --seq-len 16");
  const moesq::test::CliRun r =
      run_moesq("export " + rtn + " --format compressed-tensors --scale-block 32 --out " + dir_.file("bad"), dir_.path);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--scale-block 32 needs paired 4:8"), std::string::npos) << r.err;
}

// The reference quantizes gate and up with separate global scales: up projections rewritten with γ and
// every block scale doubled or halved (the same weights, a different γ than the gate's) evaluate to the
// source's nats exactly — a reader that decoded up with the gate's γ would be off by 2× on those rows.
// The same checkpoint through the GPU engine: tests/gpu/test_engine_reference_layout.cu.
TEST_F(CliReferenceLayout, SeparateGateUpGlobalScalesAreEachProjectionsOwn) {
  const std::string src = dir_.file("mag");
  must("compress " + model_ + " --method magnitude --out " + src + " --calib-samples 2 --seq-len 16");
  const int64_t layers =
      nlohmann::json::parse(std::ifstream(src + "/config.json"))["num_hidden_layers"].get<int64_t>();
  const std::string x32 = dir_.file("x32");
  must("export " + src + " --format compressed-tensors --out " + x32);
  const std::string sep = dir_.file("ref-separate");
  const int changed = moesq::test::write_reference_layout(x32, sep, layers, true);
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  const int64_t experts = layers * cfg["num_local_experts"].get<int64_t>();
  EXPECT_GT(changed, experts / 2) << "up projections with their own γ, of " << experts;
  EXPECT_EQ(nats(sep), nats(src));
}

}  // namespace

namespace {

// Integer expert codes with no quantization_config (int8 / uint8 / int32 .weight, with a weight_scale
// beside them as quantizers store them) are refused naming the tensor, not read as floats.
TEST(CliIntegerExperts, IntegerExpertWeightWithoutConfigIsRefusedNamingIt) {
  using moesq::io::DType;
  for (const DType dtype : {DType::I8, DType::U8, DType::I32}) {
    const std::string dname = moesq::io::dtype_name(dtype);
    moesq::test::TempDir dir("moesq_test_cli_integer_experts");
    const std::filesystem::path out = dir.path / "int";
    std::filesystem::create_directories(out);
    const moesq::io::Checkpoint src(MOESQ_DEFAULT_MODEL);
    moesq::io::SafetensorsWriter w;
    std::string victim;
    std::vector<uint8_t> codes;
    std::vector<float> scale;
    for (const std::string& name : src.names()) {
      const moesq::io::TensorView& t = src.get(name);
      if (victim.empty() && name.find(".experts.0.up_proj.weight") != std::string::npos) {
        victim = name;
        const size_t width = dtype == DType::I32 ? 4 : 1;
        codes.assign(static_cast<size_t>(t.numel()) * width, 3);
        w.add(name, dtype, t.shape, codes.data(), codes.size());
        scale.assign(static_cast<size_t>(t.shape[0]), 0.01f);
        w.add_f32(name.substr(0, name.size() - 7) + ".weight_scale", {t.shape[0], 1}, scale);
        continue;
      }
      w.add(name, t.dtype, t.shape, t.data, t.nbytes);
    }
    ASSERT_FALSE(victim.empty());
    w.write((out / "model.safetensors").string());
    for (const auto& e : std::filesystem::directory_iterator(MOESQ_DEFAULT_MODEL))
      if (e.path().extension() != ".safetensors" && e.path().filename() != "model.safetensors.index.json")
        std::filesystem::copy_file(e.path(), out / e.path().filename());
    std::ofstream(dir.file("text.txt")) << "def f(x):\n    return x\n";
    for (const std::string cmd : {"eval " + out.string() + " --data " + dir.file("text.txt") + " --seq-len 8",
                                  "inspect " + out.string()}) {
      const moesq::test::CliRun r = run_moesq(cmd, dir.path.string());
      EXPECT_EQ(r.rc, 1) << dname << ": " << cmd << "\n" << r.err;
      EXPECT_NE(r.err.find("tensor " + victim + " has integer dtype " + dname), std::string::npos) << cmd << "\n" << r.err;
      EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
    }
  }
}

}  // namespace
