// `moesq inspect` on every imported layout reports what each expert projection's tensors HOLD
// (docs/FORMAT.md): moesq paired 4:8, its compressed-tensors and pair-bitmask exports, a dense-NVFP4
// compressed-tensors checkpoint, INT4 pack-quantized, and a compressed-tensors checkpoint mixing
// paired 4:8 and dense NVFP4 projections. Bits/weight are checked against the tensor bytes summed
// here independently; the activation block against what `eval` runs. Unsupported quant_method,
// format and activation schemes are refused by inspect and eval naming the field and the value.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/tensor_names.h"
#include "support/int4_checkpoint.h"
#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using moesq::test::CliRun;
using moesq::test::slurp;

class InspectLayouts : public ::testing::Test {
 protected:
  static inline moesq::test::TempDir* tmp_ = nullptr;
  static std::string dir(const std::string& name) { return tmp_->file(name); }

  static CliRun run(const std::string& args) {
    return moesq::test::run_moesq(args, tmp_->path.string());
  }
  static void must(const std::string& args) {
    const CliRun r = run(args);
    ASSERT_EQ(r.rc, 0) << args << "\n" << r.err;
  }

  // One set of checkpoints for all tests (compressing takes seconds).
  static void SetUpTestSuite() {
    tmp_ = new moesq::test::TempDir("moesq_test_cli_inspect_layouts");
    const std::string m = std::string("'") + MOESQ_DEFAULT_MODEL + "'";
    must("compress " + m + " --method magnitude --out '" + dir("mag") + "' --calib-samples 2 --seq-len 16");
    must("compress " + m + " --method rtn-nvfp4 --out '" + dir("rtn") + "' --calib-samples 2 --seq-len 16");
    must("export '" + dir("mag") + "' --format compressed-tensors --scale-block 16 --out '" + dir("mag_ct") + "'");
    must("export '" + dir("mag") + "' --format moesq-pair-bitmask --out '" + dir("mag_pb") + "'");
    must("export '" + dir("rtn") + "' --format compressed-tensors --out '" + dir("rtn_ct") + "'");
    moesq::test::write_int4_checkpoint(moesq::io::Checkpoint(MOESQ_DEFAULT_MODEL), dir("int4"), 32);
    // mixed: mag_ct with the projections of layer 0 expert 0 (gate, up, down) taken from rtn_ct.
    const moesq::io::Checkpoint a(dir("mag_ct")), b(dir("rtn_ct"));
    moesq::io::SafetensorsWriter w;
    const std::string swapped = "model.layers.0.mlp.experts.0.";
    for (const std::string& n : a.names()) {
      const moesq::io::TensorView& t = (n.rfind(swapped, 0) == 0 ? b : a).get(n);
      w.add(n, t.dtype, t.shape, t.data, t.nbytes);
    }
    fs::create_directories(dir("mixed_ct"));
    moesq::io::write_checkpoint_tensors(dir("mixed_ct"), w);
    fs::copy_file(fs::path(dir("mag_ct")) / "config.json", fs::path(dir("mixed_ct")) / "config.json");
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }

  static json inspect(const std::string& d) {
    const CliRun r = run("inspect '" + d + "' --json");
    EXPECT_EQ(r.rc, 0) << r.err;
    return r.rc == 0 ? json::parse(r.out) : json();
  }
  // Σ nbytes of the expert tensors of projection `proj`, and their count of experts, summed here.
  static std::pair<uint64_t, int64_t> proj_bytes(const std::string& d, const std::string& proj) {
    const moesq::io::Checkpoint c(d);
    uint64_t bytes = 0;
    std::set<std::string> prefixes;
    for (const std::string& n : c.names()) {
      const auto p = moesq::io::parse_expert_tensor(n);
      if (!p || p->proj != proj) continue;
      bytes += c.get(n).nbytes;
      prefixes.insert(n.substr(0, n.rfind('.')));
    }
    return {bytes, static_cast<int64_t>(prefixes.size())};
  }
  static std::string eval_act_block(const std::string& d) {
    std::ofstream(tmp_->file("data.txt")) << "the expert routes tokens to a sparse kernel; " << d;
    const CliRun r = run("eval '" + d + "' --data '" + tmp_->file("data.txt") + "' --seq-len 16 --json");
    EXPECT_EQ(r.rc, 0) << r.err;
    const json j = json::parse(r.out);
    return j["act_quant"] == "none" ? "none (weight-only)" : "nvfp4 block " + std::to_string(j["act_block_size"].get<int>());
  }

  // Every projection holds `kind` (all 128 experts), bits/weight from the bytes summed here.
  static void expect_all(const std::string& name, const std::string& layout, const std::string& kind) {
    SCOPED_TRACE(name);
    const std::string d = dir(name);
    const json j = inspect(d);
    ASSERT_FALSE(j.is_null());
    EXPECT_EQ(j["layout"], layout);
    EXPECT_EQ(j["activations"], eval_act_block(d));
    EXPECT_EQ(j["parameters"]["routed_experts"], 12582912);  // logical weights: the same in every layout
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      const json& p = j["projections"][proj];
      EXPECT_EQ(p["count"], 128) << proj;
      EXPECT_EQ(p["storage"], json({{kind, 128}})) << proj;
      const auto [bytes, count] = proj_bytes(d, proj);
      EXPECT_EQ(count, 128);
      EXPECT_EQ(p["bytes"].get<uint64_t>(), bytes) << proj;
      EXPECT_DOUBLE_EQ(p["bits_per_weight"].get<double>(), 8.0 * static_cast<double>(bytes) / (128.0 * 128 * 256)) << proj;
    }
  }
};

TEST_F(InspectLayouts, EachLayoutReportsWhatItsProjectionsHold) {
  expect_all("mag", "moesq", "paired-4:8-nvfp4");
  expect_all("mag_ct", "compressed-tensors/nvfp4-pack-quantized group_size 16", "paired-4:8-nvfp4");  // detected from data
  expect_all("mag_pb", "compressed-tensors/nvfp4-pack-quantized+pair-bitmask group_size 32 (reference layout)", "paired-4:8-nvfp4");
  expect_all("rtn_ct", "compressed-tensors/nvfp4-pack-quantized group_size 16", "nvfp4");
  expect_all("int4", "compressed-tensors/pack-quantized", "int4");
  EXPECT_EQ(inspect(dir("int4"))["weight_group"], 32);
  // The byte-level layouts differ: 2.75 (moesq) < 3.0 (pair-bitmask, 16-blocks) < 4.5 (dense NVFP4).
  const double m = inspect(dir("mag"))["projections"]["gate_proj"]["bits_per_weight"];
  const double pb = inspect(dir("mag_pb"))["projections"]["gate_proj"]["bits_per_weight"];
  const double ct = inspect(dir("mag_ct"))["projections"]["gate_proj"]["bits_per_weight"];
  EXPECT_LT(m, pb);
  EXPECT_LT(pb, ct);
}

TEST_F(InspectLayouts, MixedCompressedTensorsCountsEachKindAndRunsTheDenseBlock) {
  const json j = inspect(dir("mixed_ct"));
  for (const char* proj : {"gate_proj", "up_proj", "down_proj"})
    EXPECT_EQ(j["projections"][proj]["storage"], json({{"nvfp4", 1}, {"paired-4:8-nvfp4", 127}})) << proj;
  EXPECT_EQ(j["activations"], "nvfp4 block 16");
  EXPECT_EQ(j["activations"], eval_act_block(dir("mixed_ct")));
  const CliRun t = run("inspect '" + dir("mixed_ct") + "'");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("gate_proj       128 x [128, 256]: 1 nvfp4 127 paired-4:8-nvfp4"), std::string::npos) << t.out;
}

// A copy of mag_ct whose quantization_config is edited: inspect and eval exit 1 naming field + value.
TEST_F(InspectLayouts, UnsupportedSchemesAreRefusedNamingFieldAndValue) {
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    const char* want;
  };
  const std::vector<Case> cases = {
      {"qm", [](json& q) { q["quant_method"] = "bitsandbytes"; }, "quant_method \"bitsandbytes\""},
      {"fmt", [](json& q) { q["format"] = "float-quantized"; }, "format \"float-quantized\""},
      {"a8", [](json& q) { q["config_groups"]["group_0"]["input_activations"]["num_bits"] = 8; },
       "input_activations.num_bits is 8"},
      {"aint", [](json& q) { q["config_groups"]["group_0"]["input_activations"]["type"] = "int"; },
       "input_activations.type is \"int\""},
      {"wstrat", [](json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "channel"; },
       "weights.strategy is \"channel\""},
  };
  for (const Case& c : cases) {
    const fs::path d = fs::path(dir(std::string("bad_") + c.name));
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(dir("mag_ct")))
      if (e.path().filename() != "config.json") fs::create_symlink(e.path(), d / e.path().filename());
    json cfg = json::parse(slurp(dir("mag_ct") + "/config.json"));
    c.edit(cfg["quantization_config"]);
    std::ofstream(d / "config.json") << cfg.dump(2);
    std::ofstream(tmp_->file("data.txt")) << "some text for the evaluation of this checkpoint";
    for (const std::string cmd : {"inspect '" + d.string() + "'",
                                  "eval '" + d.string() + "' --data '" + tmp_->file("data.txt") + "' --seq-len 8"}) {
      const CliRun r = run(cmd);
      EXPECT_EQ(r.rc, 1) << cmd;
      EXPECT_NE(r.err.find(c.want), std::string::npos) << cmd << "\n" << r.err;
      EXPECT_NE(r.err.find("config.json"), std::string::npos) << cmd << "\n" << r.err;
      EXPECT_EQ(r.out, "") << cmd;
    }
  }
}

}  // namespace
