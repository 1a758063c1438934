// End-to-end `moesq export` and `compress --export-format` on the embedded tiny Qwen3-MoE: an SGPTQ
// checkpoint (small calibration) exported to compressed-tensors and pair-bitmask evaluates to exactly
// the same nats/token as the moesq checkpoint (same dequantized weights, same W4A4 block 32), and bad
// input (unknown format, dense source for pair-bitmask, foreign quant_method) exits 1 naming it.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "support/int4_checkpoint.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

struct CliRun {
  int rc = -1;
  std::string out, err;
};

class CliExport : public ::testing::Test {
 protected:
  moesq::test::TempDir dir_{"moesq_test_cli_export"};
  const std::string model_ = MOESQ_DEFAULT_MODEL;

  void SetUp() override {
    std::ofstream t(dir_.file("text.txt"));
    for (int i = 0; i < 200; ++i) t << "def f" << i << "(x):\n    return x * " << i << " + " << (i * 7) % 13 << "\n";
  }
  CliRun run(const std::string& args) { return run_shell(std::string(MOESQ_BINARY) + " " + args); }
  CliRun run_shell(const std::string& command) {
    const std::string o = dir_.file("stdout"), e = dir_.file("stderr");
    const std::string cmd = "MOESQ_QUIET=1 " + command + " >" + o + " 2>" + e;
    const int st = std::system(cmd.c_str());
    CliRun r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    std::ifstream fo(o), fe(e);
    std::stringstream so, se;
    so << fo.rdbuf();
    se << fe.rdbuf();
    r.out = so.str();
    r.err = se.str();
    return r;
  }
  nlohmann::json eval(const std::string& ckpt) {
    const CliRun r = run("eval " + ckpt + " --data " + dir_.file("text.txt") + " --seq-len 64 --json");
    EXPECT_EQ(r.rc, 0) << r.err;
    return r.rc == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
  }
  std::string compress(const std::string& method, const std::string& out, const std::string& extra = "") {
    const CliRun r = run("compress " + model_ + " --method " + method + " --out " + out + " --calib " +
                         dir_.file("text.txt") + " --calib-samples 4 --seq-len 32 " + extra);
    EXPECT_EQ(r.rc, 0) << r.err;
    return out;
  }
};

TEST_F(CliExport, SgptqExportsEvaluateToIdenticalNats) {
  const std::string src = compress("sgptq", dir_.file("sgptq"));
  const nlohmann::json ref = eval(src);
  ASSERT_TRUE(ref.is_object());
  EXPECT_EQ(ref["expert_format"], "paired-4:8-nvfp4");
  for (const char* f : {"compressed-tensors", "moesq-pair-bitmask"}) {
    const std::string out = dir_.file(std::string("x-") + f);
    const CliRun r = run("export " + src + " --format " + f + " --out " + out + " --json");
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto s = nlohmann::json::parse(r.out);
    EXPECT_EQ(s["format"], f);
    EXPECT_EQ(s["paired48_projections"], s["projections"]);
    EXPECT_NEAR(s["bits_per_expert_weight"].get<double>(), std::string(f) == "compressed-tensors" ? 4.25 : 2.75, 0.01);
    EXPECT_TRUE(fs::exists(out + "/report.json")) << "side files travel";
    const nlohmann::json e = eval(out);
    ASSERT_TRUE(e.is_object());
    EXPECT_EQ(e["expert_format"], "paired-4:8-nvfp4") << f << ": paired 4:8 detected from the data";
    EXPECT_EQ(e["act_block_size"], ref["act_block_size"]) << f;
    EXPECT_EQ(e["nats_per_token"].get<double>(), ref["nats_per_token"].get<double>()) << f;
  }
  // An independent decoder written from docs/FORMAT.md (pure Python) gets the same fp32 bits from
  // all three layouts (layer 0, to stay quick).
  if (std::system("python3 --version >/dev/null 2>&1") == 0) {
    const CliRun d = run_shell("python3 " + std::string(MOESQ_FIXTURES) + "/../../scripts/decode_exports.py " + src +
                               " " + dir_.file("x-compressed-tensors") + " " + dir_.file("x-moesq-pair-bitmask") +
                               " --layers 1");
    EXPECT_EQ(d.rc, 0) << d.out << d.err;
    EXPECT_NE(d.out.find("bitwise equal: 96 projections"), std::string::npos) << d.out << d.err;
  }
  // compress --export-format writes the exported layout directly; same bits, same nats.
  const std::string direct = compress("sgptq", dir_.file("direct"), "--export-format compressed-tensors");
  std::ifstream cf(direct + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cf)["quantization_config"]["quant_method"], "compressed-tensors");
  EXPECT_TRUE(fs::exists(direct + "/report.json"));
  for (const auto& e : fs::directory_iterator(dir_.path))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  EXPECT_EQ(eval(direct)["nats_per_token"].get<double>(), ref["nats_per_token"].get<double>());
}

TEST_F(CliExport, DenseNvfp4RoundTripsThroughCompressedTensors) {
  const std::string src = compress("rtn-nvfp4", dir_.file("rtn"));
  const std::string out = dir_.file("ct");
  ASSERT_EQ(run("export " + src + " --format compressed-tensors --out " + out).rc, 0);
  const nlohmann::json a = eval(src), b = eval(out);
  EXPECT_EQ(b["expert_format"], "nvfp4");
  EXPECT_EQ(b["act_block_size"], 16);
  EXPECT_EQ(a["nats_per_token"].get<double>(), b["nats_per_token"].get<double>());
  const CliRun r = run("export " + src + " --format moesq-pair-bitmask --out " + dir_.file("pb"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("not paired 4:8"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_.file("pb")));
}

TEST_F(CliExport, Int4PackQuantizedIsReadAndCompressible) {
  // The paper compresses from the INT4 release: eval reads it weight-only, compress takes it as SOURCE.
  const std::string int4 = dir_.file("int4");
  moesq::test::write_int4_checkpoint(moesq::io::Checkpoint(model_), int4, 32);
  const nlohmann::json e = eval(int4);
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(e["expert_format"], "int4-pack-quantized");
  EXPECT_FALSE(e.contains("act_block_size")) << e.dump();
  const nlohmann::json ref = eval(model_);
  EXPECT_LT(std::fabs(e["nats_per_token"].get<double>() - ref["nats_per_token"].get<double>()), 0.5);
  const CliRun r = run("compress " + int4 + " --method rtn-nvfp4 --calib-samples 2 --seq-len 16 --out " +
                       dir_.file("from-int4") + " --export-format moesq-pair-bitmask");
  EXPECT_EQ(r.rc, 1) << "rtn-nvfp4 is dense: pair-bitmask refused";
  ASSERT_EQ(run("compress " + int4 + " --method magnitude --calib-samples 2 --seq-len 16 --out " +
                dir_.file("from-int4") + " --export-format moesq-pair-bitmask").rc, 0);
  EXPECT_EQ(eval(dir_.file("from-int4"))["expert_format"], "paired-4:8-nvfp4");
}

TEST_F(CliExport, BadInputNamesTheFlagOrField) {
  CliRun r = run("export " + model_ + " --format onnx --out " + dir_.file("o"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--format \"onnx\""), std::string::npos) << r.err;
  r = run("export " + model_ + " --format compressed-tensors --out " + dir_.file("o"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("not NVFP4-compressed"), std::string::npos) << r.err;
  r = run("compress " + model_ + " --method rtn-nvfp4 --export-format gguf --out " + dir_.file("o"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--export-format \"gguf\""), std::string::npos) << r.err;
  // A foreign quant_method: eval refuses it naming the field and the value.
  const fs::path fp8 = dir_.path / "fp8";
  fs::create_directories(fp8);
  for (const auto& e : fs::directory_iterator(model_)) fs::copy_file(e.path(), fp8 / e.path().filename());
  std::ifstream cf(fp8 / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(cf);
  cf.close();
  cfg["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  std::ofstream(fp8 / "config.json") << cfg.dump(2);
  r = run("eval " + fp8.string() + " --data " + dir_.file("text.txt") + " --seq-len 32");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("quant_method \"fp8\" is not supported"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_.file("o")));
  EXPECT_TRUE(run("export --help").out.find("weight_sparse_mask") != std::string::npos);
}

}  // namespace
