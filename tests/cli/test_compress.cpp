// End-to-end CLI tests of `moesq compress` and `moesq eval` on the embedded tiny Qwen3-MoE, and the
// bad-input contract: clear message naming the file/flag, non-zero exit, no partial output left.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "compress/refine/schedule.h"
#include "core/half.h"
#include "core/hash.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace {

struct CmdResult {
  int code = -1;
  std::string out, err;
};

CmdResult run(const std::string& args, const std::string& env = "") {
  const fs::path dir = fs::temp_directory_path() / ("moesq_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string o = (dir / "stdout").string(), e = (dir / "stderr").string();
  const std::string cmd = env + std::string(" MOESQ_QUIET=1 ") + MOESQ_BINARY + " " + args + " >" + o + " 2>" + e;
  const int st = std::system(cmd.c_str());
  CmdResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream fo(o), fe(e);
  r.out.assign(std::istreambuf_iterator<char>(fo), {});
  r.err.assign(std::istreambuf_iterator<char>(fe), {});
  return r;
}

class CliCompress : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = fs::temp_directory_path() / ("moesq_cc_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
    // A small text for calibration and evaluation: a few KB of varied ASCII.
    std::ofstream t(tmp_ / "text.txt");
    for (int i = 0; i < 200; ++i) t << "def f" << i << "(x):\n    return x * " << i << " + " << (i * 7) % 13 << "\n";
  }
  void TearDown() override { fs::remove_all(tmp_); }
  fs::path tmp_;
  const std::string model_ = MOESQ_DEFAULT_MODEL;
};

TEST_F(CliCompress, SgptqEndToEndThenEval) {
  const fs::path out = tmp_ / "out";
  CmdResult r = run("compress " + model_ + " --method sgptq --out " + out.string() + " --calib " + (tmp_ / "text.txt").string() +
              " --calib-samples 8 --seq-len 64 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["method"], "sgptq");
  // Measured from the written bytes: 2.75 bits plus the 4-byte global scale per projection.
  EXPECT_NEAR(j["bits_per_expert_weight"].get<double>(), 2.75, 0.01);
  EXPECT_GT(j["seconds"].get<double>(), 0.0);
  std::ifstream rf(out / "report.json");
  ASSERT_TRUE(rf) << "report.json missing";
  const auto rep = nlohmann::json::parse(rf);
  ASSERT_EQ(rep["layers"].size(), 4u);
  ASSERT_EQ(rep["layers"][0]["experts"].size(), 32u);
  int64_t tokens = 0;
  for (const auto& e : rep["layers"][0]["experts"]) tokens += e["tokens"].get<int64_t>();
  EXPECT_EQ(tokens, 8 * 64 * 4) << "every routed token (top-4) is counted once per layer";
  std::ifstream cf(out / "config.json");
  const auto cfg = nlohmann::json::parse(cf);
  EXPECT_EQ(cfg["quantization_config"]["format"], "paired-4:8-nvfp4");

  CmdResult e = run("eval " + out.string() + " --data " + (tmp_ / "text.txt").string() + " --seq-len 64 --json");
  ASSERT_EQ(e.code, 0) << e.err;
  const auto ej = nlohmann::json::parse(e.out);
  const double nats = ej["nats_per_token"].get<double>();
  EXPECT_TRUE(std::isfinite(nats));
  EXPECT_GT(nats, 0.0);
  CmdResult e0 = run("eval " + model_ + " --data " + (tmp_ / "text.txt").string() + " --seq-len 64 --json");
  ASSERT_EQ(e0.code, 0) << e0.err;
  const double ref = nlohmann::json::parse(e0.out)["nats_per_token"].get<double>();
  // Compression costs something but not everything: within 1 nat/token of the reference here.
  EXPECT_NE(nats, ref);
  EXPECT_LT(std::fabs(nats - ref), 1.0);
}

// The paper's joint sparse-quantization baselines (docs/RESULTS.md): same CLI and report, paired 4:8
// checkpoints that eval, inspect and export read like any other.
TEST_F(CliCompress, JsqAndObrWriteCheckpointsEveryCommandReads) {
  for (const std::string m : {"jsq", "obr"}) {
    const fs::path out = tmp_ / m;
    CmdResult r = run("compress " + model_ + " --method " + m + " --out " + out.string() + " --calib " +
                      (tmp_ / "text.txt").string() + " --calib-samples 8 --seq-len 64 --json");
    ASSERT_EQ(r.code, 0) << m << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["method"], m);
    EXPECT_EQ(j["format"], "paired-4:8-nvfp4");
    EXPECT_NEAR(j["bits_per_expert_weight"].get<double>(), 2.75, 0.01);
    EXPECT_TRUE(j.contains(m)) << m << " options missing from the report: " << r.out;
    EXPECT_LT(j["mean_rel_error"].get<double>(), 2.0);
    CmdResult e = run("eval " + out.string() + " --data " + (tmp_ / "text.txt").string() + " --seq-len 64 --json");
    ASSERT_EQ(e.code, 0) << m << ": " << e.err;
    EXPECT_TRUE(std::isfinite(nlohmann::json::parse(e.out)["nats_per_token"].get<double>()));
    CmdResult i = run("inspect " + out.string() + " --json");
    ASSERT_EQ(i.code, 0) << m << ": " << i.err;
    EXPECT_EQ(nlohmann::json::parse(i.out)["expert_storage"], "packed");
    CmdResult x = run("export " + out.string() + " --format compressed-tensors --out " + (tmp_ / (m + "_ct")).string());
    EXPECT_EQ(x.code, 0) << m << ": " << x.err;
  }
  CmdResult bad = run("compress " + model_ + " --method obr --obr-alpha 1.5 --out " + (tmp_ / "bad").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--obr-alpha"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(tmp_ / "bad"));
}

TEST_F(CliCompress, RtnIsDenseNvfp4AndDataFree) {
  const fs::path out = tmp_ / "rtn";
  CmdResult r = run("compress " + model_ + " --method rtn-nvfp4 --out " + out.string() + " --calib-samples 2 --seq-len 16 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NEAR(j["bits_per_expert_weight"].get<double>(), 4.5, 0.01);
  EXPECT_NE(j["calibration"]["source"].get<std::string>().find("sampled"), std::string::npos);
}

TEST_F(CliCompress, OutputBitsDoNotDependOnThreadCount) {
  // Reproducibility: experts and sequences run in parallel, but every per-item result and every
  // reduction order is fixed, so the written checkpoint is byte-identical for 1 and 2 threads.
  std::string sha[2];
  for (int t = 1; t <= 2; ++t) {
    const fs::path out = tmp_ / ("t" + std::to_string(t));
    CmdResult r = run("compress " + model_ + " --method sgptq --out " + out.string() + " --calib-samples 4 --seq-len 32 --threads " +
                      std::to_string(t));
    ASSERT_EQ(r.code, 0) << r.err;
    sha[t - 1] = moesq::sha256_file((out / "model.safetensors").string());
  }
  EXPECT_EQ(sha[0], sha[1]);
}

TEST_F(CliCompress, OutNeverDeletesInputsOrForeignDirectories) {
  // --out equal to the input, a parent of the input, or an existing directory that is not an
  // earlier moesq output: refused before any work, nothing touched.
  const fs::path model = tmp_ / "model";
  fs::create_directories(model);
  for (const auto& e : fs::directory_iterator(model_)) fs::copy_file(e.path(), model / e.path().filename());
  fs::create_directories(tmp_ / "notes");
  std::ofstream(tmp_ / "notes" / "thesis.txt") << "precious";
  for (const fs::path& out : {model, tmp_, tmp_ / "notes"}) {
    CmdResult r = run("compress " + model.string() + " --method rtn-nvfp4 --out " + out.string() +
                      " --calib-samples 2 --seq-len 16");
    EXPECT_NE(r.code, 0) << out;
    EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
  }
  EXPECT_TRUE(fs::exists(model / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(tmp_ / "notes" / "thesis.txt"));
  // An earlier output may be replaced (that is what re-running does).
  const fs::path o = tmp_ / "o";
  for (int i = 0; i < 2; ++i) {
    CmdResult r = run("compress " + model.string() + " --method rtn-nvfp4 --out " + o.string() +
                      " --calib-samples 2 --seq-len 16");
    EXPECT_EQ(r.code, 0) << r.err;
  }
}

TEST_F(CliCompress, UnknownMethodNamesFlag) {
  CmdResult r = run("compress " + model_ + " --method bogus --out " + (tmp_ / "x").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--method"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_ / "x"));
}

TEST_F(CliCompress, NonWritableOutNamesFlagAndLeavesNothing) {
  // Root ignores directory permission bits, so as root the unwritable place is /proc (no user
  // directories can be created there); otherwise a 0555 directory of our own.
  const bool root = ::geteuid() == 0;
  const fs::path ro = root ? fs::path("/proc") : tmp_ / "ro";
  if (!root) {
    fs::create_directories(ro);
    ::chmod(ro.c_str(), 0555);
  }
  const fs::path out = ro / ("moesq_out_" + std::to_string(::getpid()));
  CmdResult r = run("compress " + model_ + " --method magnitude --out " + out.string());
  if (!root) ::chmod(ro.c_str(), 0755);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  if (!root) EXPECT_TRUE(fs::is_empty(ro));
}

TEST_F(CliCompress, MissingParentOfOutNamesFlag) {
  CmdResult r = run("compress " + model_ + " --method magnitude --out " + (tmp_ / "no" / "such" / "out").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_ / "no"));
}

TEST_F(CliCompress, EmptyCalibFileNamesFile) {
  const fs::path empty = tmp_ / "empty.txt";
  std::ofstream(empty).close();
  CmdResult r = run("compress " + model_ + " --method sgptq --out " + (tmp_ / "o").string() + " --calib " + empty.string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find(empty.string()), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_ / "o"));
  for (const auto& e : fs::directory_iterator(tmp_))
    EXPECT_EQ(e.path().filename().string().find("o.tmp"), std::string::npos) << "temporary left behind";
}

TEST_F(CliCompress, KNotMultipleOf32NamesTensor) {
  // A small, valid qwen3_moe checkpoint whose expert width I = 48 is not a multiple of 32: down_proj
  // has K = 48, which paired 4:8 NVFP4 cannot hold. The error must name the tensor; no output.
  const fs::path bad = tmp_ / "k48";
  fs::create_directories(bad);
  const int64_t H = 64, I = 48, E = 4, V = 256, nh = 2, nkv = 1, hd = 32;
  nlohmann::json cfg = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"vocab_size", V},
                        {"hidden_size", H}, {"intermediate_size", 96}, {"moe_intermediate_size", I},
                        {"num_hidden_layers", 1}, {"num_attention_heads", nh}, {"num_key_value_heads", nkv},
                        {"head_dim", hd}, {"num_experts", E}, {"num_experts_per_tok", 2}, {"norm_topk_prob", true},
                        {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"tie_word_embeddings", false},
                        {"decoder_sparse_step", 1}, {"mlp_only_layers", nlohmann::json::array()}};
  std::ofstream(bad / "config.json") << cfg.dump();
  moesq::io::SafetensorsWriter w;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones = false) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = moesq::f32_to_bf16(ones ? 1.0f : nd(rng));
    w.add(name, moesq::io::DType::BF16, shape, v.data(), v.size() * 2);
  };
  add("model.embed_tokens.weight", {V, H});
  add("model.norm.weight", {H}, true);
  add("lm_head.weight", {V, H});
  const std::string p = "model.layers.0.";
  add(p + "input_layernorm.weight", {H}, true);
  add(p + "post_attention_layernorm.weight", {H}, true);
  add(p + "self_attn.q_proj.weight", {nh * hd, H});
  add(p + "self_attn.k_proj.weight", {nkv * hd, H});
  add(p + "self_attn.v_proj.weight", {nkv * hd, H});
  add(p + "self_attn.o_proj.weight", {H, nh * hd});
  add(p + "self_attn.q_norm.weight", {hd}, true);
  add(p + "self_attn.k_norm.weight", {hd}, true);
  add(p + "mlp.gate.weight", {E, H});
  for (int e = 0; e < E; ++e) {
    const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
    add(q + "gate_proj.weight", {I, H});
    add(q + "up_proj.weight", {I, H});
    add(q + "down_proj.weight", {H, I});
  }
  w.write((bad / "model.safetensors").string());
  CmdResult ok = run("eval " + bad.string() + " --data " + (tmp_ / "text.txt").string() + " --seq-len 32 --json");
  ASSERT_EQ(ok.code, 0) << "the synthetic model itself must be valid: " << ok.err;
  CmdResult r = run("compress " + bad.string() + " --method magnitude --out " + (tmp_ / "o").string() +
              " --calib-samples 2 --seq-len 16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("down_proj"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("32"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_ / "o"));
}

TEST_F(CliCompress, CalibrationShortfallWarnsAndStrictFails) {
  // 400 bytes hold 3 windows of 128 byte tokens: --calib-samples 64 gets 3 sequences.
  const fs::path small = tmp_ / "small.txt";
  {
    std::ofstream f(small);
    for (int i = 0; i < 400; ++i) f << char('a' + i % 26);
  }
  const std::string base = "compress " + model_ + " --method sgptq --calib " + small.string() +
                           " --seq-len 128 --out ";
  CmdResult r = run(base + (tmp_ / "o").string() + " --calib-samples 64 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("WARNING"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("3 sequence"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--calib-samples 64"), std::string::npos) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["calibration"]["sequences"], 3);
  CmdResult s = run(base + (tmp_ / "s").string() + " --calib-samples 64 --strict");
  EXPECT_NE(s.code, 0);
  EXPECT_NE(s.err.find("--calib-samples 64"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("--strict"), std::string::npos) << s.err;
  EXPECT_FALSE(fs::exists(tmp_ / "s"));
  // Enough data: no warning.
  CmdResult ok = run(base + (tmp_ / "k").string() + " --calib-samples 3");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.err.find("WARNING"), std::string::npos) << ok.err;
}

// --calib-sampled N: a mixed calibration, the files' sequences then N sampled from the model (which is
// read whole for the sampling); the report names both sources. Without --calib it is a flag error.
TEST_F(CliCompress, CalibSampledAddsSampledSequencesToTheFiles) {
  const fs::path small = tmp_ / "small.txt";
  {
    std::ofstream f(small);
    for (int i = 0; i < 400; ++i) f << char('a' + i % 26);
  }
  CmdResult r = run("compress " + model_ + " --method sgptq --calib " + small.string() +
                    " --seq-len 16 --calib-samples 3 --calib-sampled 2 --json --out " + (tmp_ / "m").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json c = nlohmann::json::parse(r.out)["calibration"];
  EXPECT_EQ(c["sequences"], 5) << c.dump();
  EXPECT_EQ(c["tokens"], 5 * 16) << c.dump();
  const std::string source = c["source"].get<std::string>();
  EXPECT_NE(source.find("small.txt"), std::string::npos) << source;
  EXPECT_NE(source.find("+ 2 sampled from the model"), std::string::npos) << source;
  CmdResult bad = run("compress " + model_ + " --method sgptq --seq-len 16 --calib-sampled 2 --out " +
                      (tmp_ / "b").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--calib-sampled 2"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(tmp_ / "b"));
}

TEST_F(CliCompress, MoesqRecordsScheduleAndLossPerLayer) {
  const fs::path out = tmp_ / "m";
  CmdResult r = run("compress " + model_ + " --method moesq --out " + out.string() + " --calib " +
                    (tmp_ / "text.txt").string() + " --calib-samples 4 --seq-len 32 --epochs 1 --lr-v 1e-4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("loss per layer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer 4/4:"), std::string::npos) << r.out;  // the last of 4, 1-based as every human line
  EXPECT_EQ(r.out.find("layer 0"), std::string::npos) << r.out;
  std::ifstream rf(out / "report.json");
  const auto rep = nlohmann::json::parse(rf);
  EXPECT_TRUE(rep["refine_options"]["rule_batch"].get<bool>());
  EXPECT_FALSE(rep["refine_options"]["rule_epochs"].get<bool>());
  int refined = 0;
  for (const auto& layer : rep["layers"])
    for (const auto& e : layer["experts"]) {
      const auto& sc = e["refine"]["schedule"];
      EXPECT_EQ(sc["source"]["batch"], "rule");
      EXPECT_EQ(sc["source"]["lr_A"], "rule");
      EXPECT_EQ(sc["source"]["epochs"], "set");
      EXPECT_EQ(sc["source"]["lr_V"], "set");
      EXPECT_EQ(sc["epochs"], 1);
      EXPECT_DOUBLE_EQ(sc["lr_V"].get<double>(), 1e-4);
      if (e["refine"]["skipped"].get<bool>()) continue;
      ++refined;
      const int64_t rows = e["refine"]["train_rows"].get<int64_t>();
      const auto want = moesq::compress::refine_schedule(rows, 0, 1);  // per expert, from its own rows
      EXPECT_EQ(sc["rule_rows"].get<int64_t>(), rows);
      EXPECT_EQ(sc["batch"].get<int64_t>(), want.batch);
      EXPECT_EQ(sc["steps"].get<int64_t>(), want.steps);
      EXPECT_DOUBLE_EQ(sc["lr_A"].get<double>(), want.lr_A);
    }
  EXPECT_GT(refined, 0);
  // The per-layer table: CSV beside report.json, one row per layer, before and after refinement.
  std::ifstream cf(out / "loss_per_layer.csv");
  ASSERT_TRUE(cf) << "loss_per_layer.csv missing";
  std::string line;
  std::getline(cf, line);
  EXPECT_EQ(line, "layer,experts,init_hard_loss,final_hard_loss,rel_error");
  int rows = 0;
  while (std::getline(cf, line)) {
    EXPECT_EQ(line.rfind(std::to_string(rows) + ",", 0), 0u) << line;
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), 4) << line;
    EXPECT_EQ(line.find(",,"), std::string::npos) << "moesq fills every column: " << line;
    ++rows;
  }
  EXPECT_EQ(rows, 4);
  ASSERT_EQ(rep["loss_per_layer"].size(), 4u);
  EXPECT_TRUE(rep["loss_per_layer"][0]["init_hard_loss"].is_number());
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot not on PATH: PNG not checked";
  std::ifstream pf(out / "loss_per_layer.png", std::ios::binary);
  ASSERT_TRUE(pf) << "gnuplot is on PATH but loss_per_layer.png is missing: " << r.out;
  char magic[4] = {};
  pf.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

TEST_F(CliCompress, SelectEpochBestRecordsTheChosenEpochs) {
  const fs::path out = tmp_ / "best";
  const std::string base = "compress " + model_ + " --method moesq --calib " + (tmp_ / "text.txt").string() +
                           " --calib-samples 4 --seq-len 32 --epochs 2 --select-epoch ";
  CmdResult bad = run(base + "first --out " + (tmp_ / "bad").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--select-epoch"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(tmp_ / "bad"));
  CmdResult r = run(base + "best --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream rf(out / "report.json");
  const auto rep = nlohmann::json::parse(rf);
  EXPECT_TRUE(rep["refine_options"]["restore_best"].get<bool>());
  for (size_t l = 0; l < rep["layers"].size(); ++l) {
    std::map<std::string, int64_t> want;
    for (const auto& e : rep["layers"][l]["experts"]) {
      const auto& f = e["refine"];
      if (f["skipped"].get<bool>()) continue;
      const int sel = f["selected_epoch"].get<int>();
      EXPECT_GE(sel, 0);
      EXPECT_LE(sel, 2);
      if (f["heldout_rows"].get<int64_t>() > 0) {  // never worse than SGPTQ on its held-out rows
        EXPECT_LE(f["final_hard_loss"].get<double>(), f["init_hard_loss"].get<double>());
        // The packed bits are the selected state: their loss is the curve's value at that epoch.
        const double curve = sel == 0 ? f["init_hard_loss"].get<double>() : f["hard_loss"][sel - 1].get<double>();
        EXPECT_NEAR(f["final_hard_loss"].get<double>(), curve, 1e-12 * curve) << "layer " << l << " epoch " << sel;
      }
      ++want[std::to_string(sel)];
    }
    using Counts = std::map<std::string, int64_t>;
    const Counts got = rep["loss_per_layer"][l]["selected_epochs"].get<Counts>();
    EXPECT_EQ(got, want) << "layer " << l;
  }
}

TEST_F(CliCompress, LossPerLayerWithoutGnuplotIsANote) {
  // PATH without gnuplot: the CSV is still written, the PNG is not, and the output says why.
  const fs::path out = tmp_ / "r";
  CmdResult r = run("compress " + model_ + " --method rtn-nvfp4 --out " + out.string() +
                    " --calib-samples 2 --seq-len 16", "PATH=/nonexistent");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("gnuplot not on PATH"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "loss_per_layer.png"));
  std::ifstream cf(out / "loss_per_layer.csv");
  std::string header, row0;
  std::getline(cf, header);
  std::getline(cf, row0);
  EXPECT_EQ(row0.rfind("0,", 0), 0u) << row0;
  EXPECT_NE(row0.find(",,,"), std::string::npos) << "no refinement losses for rtn-nvfp4, rel_error only: " << row0;
  EXPECT_NE(row0.back(), ',') << row0;
}

}  // namespace

namespace {

// --device: only --method sgptq and moesq have a GPU path; a flag that cannot apply is an error
// naming it before any work (no output), in CPU and CUDA builds alike.
TEST_F(CliCompress, DeviceFlagErrorsNameWhatCannotRunOnTheGpu) {
  const std::string out = (tmp_ / "o").string();
  CmdResult r = run("compress " + model_ + " --method jsq --device cuda --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--device cuda: --method jsq runs on the CPU only (the GPU runs sgptq and moesq)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = run("compress " + model_ + " --method moesq --device cpu --gpu-gemm tf32 --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--gpu-gemm tf32 applies to the refinement on the GPU"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = run("compress " + model_ + " --method moesq --device cpu --gpu-gemm tf32-backward --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--gpu-gemm tf32-backward applies to the refinement on the GPU"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = run("compress " + model_ + " --method moesq --device cpu --gpu-gemm bf16-forward --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--gpu-gemm bf16-forward applies to the refinement on the GPU"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = run("compress " + model_ + " --method moesq --device cpu --gpu-gemm bf16 --out " + out);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--gpu-gemm"), std::string::npos) << r.err;
  r = run("compress " + model_ + " --method moesq --device tpu --out " + out);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
  // The default (auto) runs a method without a GPU path on the CPU, and report.json says so.
  r = run("compress " + model_ + " --method rtn-nvfp4 --calib " + (tmp_ / "text.txt").string() +
          " --calib-samples 2 --seq-len 16 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream rep(fs::path(out) / "report.json");
  EXPECT_EQ(nlohmann::json::parse(rep).at("device"), "cpu");
}

}  // namespace

namespace {

// --step-sequences N: the layer-wide schedule end to end (report.json records it per expert); with
// --batch it is an error naming both flags.
TEST_F(CliCompress, LayerWideScheduleEndToEnd) {
  const std::string out = (tmp_ / "o").string(), text = (tmp_ / "text.txt").string();
  CmdResult r = run("compress " + model_ + " --method moesq --calib " + text +
                    " --calib-samples 8 --seq-len 32 --epochs 1 --step-sequences 3 --batch 16 --out " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--batch applies to the per-expert schedule; --step-sequences 3"), std::string::npos) << r.err;
  r = run("compress " + model_ + " --method moesq --calib " + text +
          " --calib-samples 8 --seq-len 32 --epochs 1 --step-sequences 3 --device cpu --json --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream rep(fs::path(out) / "report.json");
  const nlohmann::json j = nlohmann::json::parse(rep);
  EXPECT_EQ(j.at("refine_options").at("step_sequences"), 3);
  int refined = 0;
  for (const auto& layer : j.at("layers"))
    for (const auto& e : layer.at("experts")) {
      if (!e.contains("refine") || e["refine"].at("skipped").get<bool>()) continue;
      ++refined;
      EXPECT_EQ(e["refine"].at("schedule").at("step_sequences"), 3);
      EXPECT_EQ(e["refine"].at("schedule").at("batch"), 0);
      EXPECT_LE(e["refine"].at("steps").get<int>(), 3);  // 8 sequences, 3 per step: at most 3 steps in 1 epoch
    }
  EXPECT_GT(refined, 0);
}

}  // namespace

namespace {

// The data-free summary counts the sampling: report.json "calibration_seconds" and the summary line.
TEST_F(CliCompress, DataFreeSummaryCountsTheSampling) {
  const std::string out = (tmp_ / "o").string();
  const CmdResult r = run("compress " + model_ + " --method rtn-nvfp4 --calib-samples 4 --seq-len 16 --out " + out);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("s sampling the calibration from the model)"), std::string::npos) << r.out;
  std::ifstream rep(fs::path(out) / "report.json");
  const nlohmann::json j = nlohmann::json::parse(rep);
  ASSERT_TRUE(j.contains("calibration_seconds"));
  EXPECT_GE(j.at("calibration_seconds").get<double>(), 0.0);
}

}  // namespace
