// End-to-end `moesq eval` on the embedded model: runs the built binary on generated text files and
// checks the JSON contract, the numbers against the library's own window_nll, thread-count
// independence, and the bad-input paths (empty data file, bad flag value) naming the file/flag.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cblas.h>
#include <nlohmann/json.hpp>

#include "support/cli_run.h"
#include "io/checkpoint.h"
#include "io/tokens.h"
#include "model/decoder.h"

namespace fs = std::filesystem;

namespace {

// The CLI and the library run the same fp32 code on the same windows (both with single-threaded
// OpenBLAS: its sgemm kernel choice, hence the fp32 rounding, depends on its thread count — measured
// 1e-7 relative apart otherwise); only the order in which per-window sums are added differs
// (double): a relative 1e-12 still catches a wrong window, token or predicted position.
constexpr double kSameCodeRtol = 1e-12;

using moesq::test::CliRun;

std::string read_file(const fs::path& p) { return moesq::test::slurp(p); }

class CliEval : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("moesq_test_cli_eval_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CliRun run(const std::string& args) { return moesq::test::run_moesq(args, dir_.string()); }

  // Pseudo-English text from a small word list, fixed seed (fresh per file via `seed`).
  fs::path write_text(const std::string& name, size_t bytes, unsigned seed) {
    static const char* kWords[] = {"the", "river", "of", "time", "def", "return", "self", "and",
                                   "house", "light", "import", "x", "=", "(", ")", "\n", "said",
                                   "Prospero", ":", "water", "for", "in", "range", "if"};
    std::mt19937 rng(seed);
    std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
    std::string s;
    while (s.size() < bytes) {
      s += kWords[pick(rng)];
      s += ' ';
    }
    s.resize(bytes);
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << s;
    return p;
  }

  fs::path dir_;
};

TEST_F(CliEval, JsonContractAndNumbersMatchTheLibrary) {
  const fs::path a = write_text("a.txt", 700, 11), b = write_text("b.txt", 301, 12);
  const int64_t seq_len = 128;
  const CliRun r = run("eval '" + std::string(MOESQ_DEFAULT_MODEL) + "' --data '" + a.string() + "' '" +
                    b.string() + "' --seq-len 128 --json --threads 2");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);  // exactly one JSON object on stdout
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("model").get<std::string>(), MOESQ_DEFAULT_MODEL);
  EXPECT_EQ(j.at("act_quant").get<std::string>(), "none");  // bf16 checkpoint, --act-quant auto
  ASSERT_EQ(j.at("files").size(), 2u);

  // Recompute every file's mean with the library (windows of 128, tokens = bytes).
  const moesq::io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  const moesq::model::DecoderModel model(ckpt);
  moesq::model::ForwardOptions fo = model.default_forward_options();
  fo.threads = 1;
  openblas_set_num_threads(1);  // as `moesq eval` runs each window
  double total = 0.0;
  int64_t predicted_all = 0;
  for (size_t f = 0; f < 2; ++f) {
    const auto& jf = j["files"][f];
    const fs::path p = f == 0 ? a : b;
    EXPECT_EQ(jf.at("path").get<std::string>(), p.string());
    EXPECT_EQ(jf.at("tokens").get<int64_t>(), static_cast<int64_t>(fs::file_size(p)));
    const auto tokens = moesq::io::load_tokens(p.string(), 256);
    double sum = 0.0;
    int64_t predicted = 0;
    for (const auto& w : moesq::io::make_windows(tokens, seq_len)) {
      int64_t n = 0;
      sum += model.window_nll(w, fo, &n) * static_cast<double>(n);
      predicted += n;
    }
    // Every token after the first of each window: 700 → 6 windows (5×128 + 60), 301 → 3.
    const int64_t windows = (static_cast<int64_t>(tokens.size()) + seq_len - 1) / seq_len;
    EXPECT_EQ(predicted, static_cast<int64_t>(tokens.size()) - windows);
    const double mine = sum / static_cast<double>(predicted);
    const double cli = jf.at("nats_per_token").get<double>();
    EXPECT_NEAR(cli, mine, kSameCodeRtol * mine) << p;
    EXPECT_GT(cli, 0.0);
    EXPECT_LT(cli, std::log(256.0) * 3);  // finite, not garbage
    total += sum;
    predicted_all += predicted;
  }
  const double overall = j.at("nats_per_token").get<double>();
  EXPECT_NEAR(overall, total / static_cast<double>(predicted_all),
              kSameCodeRtol * total / static_cast<double>(predicted_all));
}

TEST_F(CliEval, ThreadCountDoesNotChangeTheResult) {
  const fs::path a = write_text("a.txt", 900, 21);
  const std::string base = "eval '" + std::string(MOESQ_DEFAULT_MODEL) + "' --data '" + a.string() +
                           "' --seq-len 100 --json --threads ";
  const CliRun r1 = run(base + "1"), r2 = run(base + "2");
  ASSERT_EQ(r1.rc, 0) << r1.err;
  ASSERT_EQ(r2.rc, 0) << r2.err;
  const auto j1 = nlohmann::json::parse(r1.out), j2 = nlohmann::json::parse(r2.out);
  EXPECT_EQ(j1.at("nats_per_token").get<double>(), j2.at("nats_per_token").get<double>());  // bitwise
}

TEST_F(CliEval, ActQuantNvfp4ChangesTheBf16Model) {
  const fs::path a = write_text("a.txt", 400, 31);
  const std::string base = "eval '" + std::string(MOESQ_DEFAULT_MODEL) + "' --data '" + a.string() +
                           "' --seq-len 128 --json --act-quant ";
  const CliRun rn = run(base + "none"), rq = run(base + "nvfp4");
  ASSERT_EQ(rn.rc, 0) << rn.err;
  ASSERT_EQ(rq.rc, 0) << rq.err;
  const auto jn = nlohmann::json::parse(rn.out), jq = nlohmann::json::parse(rq.out);
  EXPECT_EQ(jn.at("act_quant").get<std::string>(), "none");
  EXPECT_EQ(jq.at("act_quant").get<std::string>(), "nvfp4");
  const double n = jn.at("nats_per_token").get<double>(), q = jq.at("nats_per_token").get<double>();
  EXPECT_NE(n, q);  // 4-bit activations must perturb the result...
  EXPECT_LT(std::fabs(n - q), 0.5 * n);  // ...but not destroy the model
}

// A compressed checkpoint (written by `moesq compress`) is evaluated W4A4 by default, with the
// activation block of its format (16 for dense NVFP4), and W4A16 with --act-quant none.
TEST_F(CliEval, CompressedCheckpointIsEvaluatedW4A4ByDefault) {
  const fs::path calib = write_text("calib.txt", 2000, 51), data = write_text("data.txt", 300, 52);
  const fs::path out = dir_ / "rtn";
  const CliRun c = run("compress '" + std::string(MOESQ_DEFAULT_MODEL) + "' --method rtn-nvfp4 --out '" +
                       out.string() + "' --calib '" + calib.string() + "' --calib-samples 4 --seq-len 64");
  ASSERT_EQ(c.rc, 0) << c.err;
  const std::string base = "eval '" + out.string() + "' --data '" + data.string() + "' --seq-len 128 --json";
  const CliRun ra = run(base), rn = run(base + " --act-quant none"),
               rb = run("eval '" + std::string(MOESQ_DEFAULT_MODEL) + "' --data '" + data.string() +
                        "' --seq-len 128 --json");
  ASSERT_EQ(ra.rc, 0) << ra.err;
  ASSERT_EQ(rn.rc, 0) << rn.err;
  ASSERT_EQ(rb.rc, 0) << rb.err;
  const auto ja = nlohmann::json::parse(ra.out), jn = nlohmann::json::parse(rn.out),
             jb = nlohmann::json::parse(rb.out);
  EXPECT_EQ(ja.at("act_quant").get<std::string>(), "nvfp4");
  EXPECT_EQ(ja.at("act_block_size").get<int>(), 16);
  EXPECT_EQ(ja.at("expert_format").get<std::string>(), "nvfp4");
  EXPECT_EQ(jn.at("act_quant").get<std::string>(), "none");
  const double w4a4 = ja.at("nats_per_token").get<double>(), w4a16 = jn.at("nats_per_token").get<double>(),
               bf16 = jb.at("nats_per_token").get<double>();
  EXPECT_NE(w4a4, w4a16);
  EXPECT_NE(w4a16, bf16);  // the experts really are 4-bit
  EXPECT_LT(std::fabs(w4a4 - bf16), 0.5 * bf16) << "dense NVFP4 should not destroy the model";
}

TEST_F(CliEval, EmptyDataFileFailsNamingTheFile) {
  const fs::path empty = dir_ / "empty.txt";
  std::ofstream(empty).close();
  const CliRun r = run("eval '" + std::string(MOESQ_DEFAULT_MODEL) + "' --data '" + empty.string() + "' --json");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find(empty.string()), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find('{'), std::string::npos) << "no JSON on failure: " << r.out;
}

TEST_F(CliEval, BadFlagValuesFailNamingTheFlag) {
  const fs::path a = write_text("a.txt", 200, 41);
  const std::string base = "eval '" + std::string(MOESQ_DEFAULT_MODEL) + "' --data '" + a.string() + "' ";
  const CliRun r1 = run(base + "--act-quant int8");
  EXPECT_NE(r1.rc, 0);
  EXPECT_NE(r1.err.find("--act-quant"), std::string::npos) << r1.err;
  const CliRun r2 = run(base + "--seq-len 1");
  EXPECT_NE(r2.rc, 0);
  EXPECT_NE(r2.err.find("--seq-len"), std::string::npos) << r2.err;
  const CliRun r3 = run("eval '" + (dir_ / "no-such-model").string() + "' --data '" + a.string() + "'");
  EXPECT_NE(r3.rc, 0);
  EXPECT_NE(r3.err.find("no-such-model"), std::string::npos) << r3.err;
  const CliRun r4 = run(base + "--deterministic maybe");
  EXPECT_NE(r4.rc, 0);
  EXPECT_NE(r4.err.find("--deterministic"), std::string::npos) << r4.err;
  const CliRun r5 = run(base + "--deterministic off");  // the CPU forward has no non-deterministic mode
  EXPECT_NE(r5.rc, 0);
  EXPECT_NE(r5.err.find("--deterministic off applies to --device cuda"), std::string::npos) << r5.err;
}

}  // namespace
