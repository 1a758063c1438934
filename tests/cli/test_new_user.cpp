// What a new user typing wrong values finds (the wu5 pass over the CLI): each case exited 0 with a
// silently changed input, died with an uncaught exception, or printed a message that named the wrong
// thing. Each must now exit non-zero naming the flag / file / expert, or print what is true, and
// leave no output behind.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "support/cli_run.h"
#include "support/family_reference.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

using moesq::test::CliRun;

class NewUser : public ::testing::Test {
 protected:
  moesq::test::TempDir tmp_{"moesq_test_new_user"};
  CliRun run(const std::string& args) { return moesq::test::run_moesq(args, tmp_.path.string()); }
  std::string model() const { return std::string("'") + MOESQ_DEFAULT_MODEL + "'"; }
  bool nothing_named(const std::string& prefix) const {
    return moesq::test::entries_with_prefix(tmp_.path, prefix).empty();
  }
};

// A --prompt-ids value past int32 was narrowed (4294967297 -> id 1) and the run went ahead.
TEST_F(NewUser, PromptIdsPastInt32AreRefusedNotWrapped) {
  for (const char* id : {"4294967297", "-4294967295"}) {
    const std::string ids = tmp_.write("ids.txt", std::string("7 ") + id + "\n");
    const CliRun r = run("generate " + model() + " --prompt-ids '" + ids + "' --max-new-tokens 2 --json");
    EXPECT_EQ(r.rc, 1) << id << ": " << r.out;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_NE(r.err.find("--prompt-ids"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(id), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(item 1)"), std::string::npos) << r.err;
  }
  // In range still runs.
  const std::string ids = tmp_.write("ok.txt", "7 255\n");
  const CliRun ok = run("generate " + model() + " --prompt-ids '" + ids + "' --max-new-tokens 2 --json");
  EXPECT_EQ(ok.rc, 0) << ok.err;
}

// CLI11 read `--seed -1` into the uint64 as 2^64 - 1; compress refuses a negative seed, generate did not.
TEST_F(NewUser, GenerateRefusesANegativeSeed) {
  const CliRun r = run("generate " + model() + " --prompt 'the ' --temperature 1 --seed -1 --max-new-tokens 2");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("--seed"), std::string::npos) << r.err;
}

// `--prompt ''` was told to "give exactly one of --prompt, --prompt-ids" although it gave one.
TEST_F(NewUser, EmptyPromptIsCalledEmpty) {
  CliRun r = run("generate " + model() + " --prompt '' --max-new-tokens 2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("the prompt is empty"), std::string::npos) << r.err;
  r = run("generate " + model() + " --max-new-tokens 2");  // none given: still the "exactly one" message
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("exactly one of --prompt, --prompt-ids"), std::string::npos) << r.err;
}

// Data-free calibration with a huge --calib-samples ended in "internal error: std::bad_alloc" (exit 2).
TEST_F(NewUser, HugeCalibSamplesNamesTheFlags) {
  const std::string out = (tmp_.path / "out").string();
  const CliRun r = run("compress " + model() + " --method sgptq --out '" + out +
                       "' --calib-samples 99999999999 --seq-len 16 --threads 1");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--calib-samples 99999999999"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--seq-len 16"), std::string::npos) << r.err;
  EXPECT_TRUE(nothing_named("out")) << "no OUT, OUT.tmp.*, OUT.work";
}

// A refinement that diverges (absurd Lion rates) failed with "NVFP4 quantization: non-finite value
// -nan at index 0 of 65536": no layer, no expert, no method.
TEST_F(NewUser, DivergedRefinementNamesLayerAndExpert) {
  const std::string out = (tmp_.path / "out").string();
  const CliRun r = run("compress " + model() + " --method moesq --out '" + out +
                       "' --calib-samples 4 --seq-len 16 --threads 1 --epochs 1 --lr-a 1e300 --lr-v 1e300");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("layer 1/4 expert "), std::string::npos) << r.err;  // 1-based, as the progress lines
  EXPECT_NE(r.err.find("--method moesq"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("non-finite"), std::string::npos) << r.err;
  EXPECT_TRUE(nothing_named("out.tmp")) << "no OUT.tmp.* left";
  EXPECT_FALSE(fs::exists(out));
}

// A dense-MLP layer (deepseek_v3's first_k_dense_replace) printed "layer 0: rel error nan" in the
// per-layer table, which reads as a failure of that layer.
TEST_F(NewUser, DenseLayerInTheLossTableIsNotNan) {
  const std::string fix = "tiny-deepseek-v3";
  const std::string src = moesq::test::shared_models_dir(fix) + "/" + fix;
  if (!fs::is_directory(src)) GTEST_SKIP() << "fixture " << src << " not present";
  const std::string out = (tmp_.path / "out").string();
  const CliRun r =
      run("compress '" + src + "' --method sgptq --out '" + out + "' --calib-samples 2 --seq-len 16 --threads 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.find("nan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer 1/3: dense MLP, kept as stored"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer 2/3: rel error "), std::string::npos) << r.out;
}

// `tokenize --text-file DIR` said "no such file" about a directory that exists.
TEST_F(NewUser, TextFileThatIsADirectoryIsCalledThat) {
  const CliRun r = run("tokenize " + model() + " --text-file '" + tmp_.path.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("--text-file: " + tmp_.path.string() + ": not a regular file"), std::string::npos) << r.err;
  const CliRun missing = run("tokenize " + model() + " --text-file '" + tmp_.file("nope.txt") + "'");
  EXPECT_NE(missing.err.find("no such file"), std::string::npos) << missing.err;
}

// `audit run --out R` a second time (and so `audit study --out S` a second time) was refused with
// "R exists and is not an earlier output (no marker)": its AtomicDir had no marker file.
TEST_F(NewUser, AuditRunReplacesItsOwnEarlierRun) {
  const std::string r1 = (tmp_.path / "r1").string();
  CliRun r = run("audit run --fixture small --out '" + r1 + "'");
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run("audit run --fixture small --out '" + r1 + "'");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::exists(fs::path(r1) / "manifest.json"));
  // A directory of something else is still never replaced.
  const fs::path other = tmp_.path / "other";
  fs::create_directories(other);
  tmp_.write("other/keep.txt", "x");
  r = run("audit run --fixture small --out '" + other.string() + "'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("no manifest.json"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(other / "keep.txt"));
  // The injected plan is an input: an --out that holds it is refused, not deleted on commit.
  r = run("audit run --fixture small --out '" + r1 + "' --plan '" + r1 + "/plan.json'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("is or contains the input"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(fs::path(r1) / "plan.json"));
}

// `audit run --plan RUN_DIR` (the run, not its plan.json) died with "internal error:
// basic_filebuf::underflow error reading the file: Is a directory", exit 2.
TEST_F(NewUser, AuditPlanThatIsADirectoryIsAnError) {
  const std::string r1 = (tmp_.path / "r1").string();
  ASSERT_EQ(run("audit run --fixture small --out '" + r1 + "'").rc, 0);
  const CliRun r = run("audit run --fixture small --out '" + (tmp_.path / "r2").string() + "' --plan '" + r1 + "'");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(r1 + " is a directory"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp_.path / "r2"));
}

// `demo --data F` with F of one token printed nats/token "-nan" for every row and exited 0; `eval`
// refuses the same file.
TEST_F(NewUser, DemoOnADataFileWithNothingToPredictFails) {
  const std::string one = tmp_.write("one.txt", "a");
  const std::string out = (tmp_.path / "demo").string();
  const CliRun r = run("demo --methods rtn-nvfp4 --data '" + one + "' --out '" + out +
                       "' --calib-samples 2 --seq-len 16 --threads 1 --json");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_NE(r.err.find("--data: file " + one + " has 1 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing to predict"), std::string::npos) << r.err;
}

// `compress --export-format F` builds the moesq checkpoint in a sibling first. Named
// OUT.moesq.tmp.<pid>, it survived a kill -9 for good: the next run writing OUT cleans only
// OUT.tmp.<dead pid>*. Now it is OUT.tmp.<pid>.moesq and is cleaned like the others.
TEST_F(NewUser, ExportFormatIntermediateOfAKilledRunIsCleaned) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);  // a dead pid
  const fs::path out = tmp_.path / "out";
  const std::string dead = std::to_string(child), live = std::to_string(::getpid());
  const fs::path orphan = tmp_.path / ("out.tmp." + dead + ".moesq");
  const fs::path orphan_tmp = tmp_.path / ("out.tmp." + dead + ".moesq.tmp." + dead);
  const fs::path kept = tmp_.path / ("out.tmp." + live + ".moesq");  // a live run's
  for (const fs::path& d : {orphan, orphan_tmp, kept}) fs::create_directories(d);
  tmp_.write(orphan.filename().string() + "/model.safetensors", "partial");
  const CliRun r = run("compress " + model() + " --method rtn-nvfp4 --export-format compressed-tensors --out '" +
                       out.string() + "' --calib-samples 2 --seq-len 16 --threads 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(fs::exists(out / "export.json"));
  EXPECT_FALSE(fs::exists(orphan));
  EXPECT_FALSE(fs::exists(orphan_tmp));
  EXPECT_TRUE(fs::exists(kept));
  fs::remove_all(kept);
  // Only OUT and nothing else of this run is left.
  EXPECT_EQ(moesq::test::entries_with_prefix(tmp_.path, "out").size(), 1u);
}

// `compress --out x/ --export-format F` put its intermediate at x/.moesq.tmp.<pid> and failed after
// all the work ("--out x/.moesq.tmp.N: parent directory x does not exist"), leaving x.work behind.
TEST_F(NewUser, TrailingSlashOutWithExportFormat) {
  const std::string out = (tmp_.path / "x").string() + "/";
  for (int i = 0; i < 2; ++i) {  // a fresh OUT, then replacing the earlier one
    const CliRun r = run("compress " + model() + " --method rtn-nvfp4 --export-format compressed-tensors --out '" +
                         out + "' --calib-samples 2 --seq-len 16 --threads 1");
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(fs::exists(tmp_.path / "x" / "export.json"));
    EXPECT_EQ(moesq::test::entries_with_prefix(tmp_.path, "x").size(), 1u) << "x.work or a temporary left";
  }
}

// A 4-token prompt with --max-new-tokens 2000 was told "--max-new-tokens 2004 exceeds ...".
TEST_F(NewUser, TooLongGenerationNamesPromptAndFlagValues) {
  const CliRun r = run("generate " + model() + " --prompt 'the ' --max-new-tokens 2000");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.err.find("prompt (4 tokens) + --max-new-tokens 2000 = 2004 exceeds the model's max_position_embeddings (1024)"),
            std::string::npos)
      << r.err;
}

// `bench e2e --batch abc` died with "internal error: stoi" (exit 2); "1.5" ran as batch 1, and an
// empty list took max_element of nothing. Checked before the engine starts, so also without CUDA.
TEST_F(NewUser, BenchE2eBatchListIsParsedStrictly) {
  for (const char* b : {"abc", "1,,8", "0", "-3", "1.5", "99999999999"}) {
    const CliRun r = run(std::string("bench e2e --synthetic qwen3-30b-a3b --experts bf16 --batch '") + b + "'");
    EXPECT_EQ(r.rc, 1) << b << ": " << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--batch item '"), std::string::npos) << b << ": " << r.err;
  }
  const CliRun empty = run("bench e2e --synthetic qwen3-30b-a3b --experts bf16 --batch ''");
  EXPECT_EQ(empty.rc, 1);
  EXPECT_NE(empty.err.find("--batch is empty"), std::string::npos) << empty.err;
}

// `export` reads SRC/report.json for calibration amax (docs/FORMAT.md "input_global_scale"); a
// report.json of another shape ({"layers": 5}) ended in "internal error: type_error.306", exit 2.
// Entries it cannot use count as absent: the default scale, said so in export.json.
TEST_F(NewUser, ExportIgnoresAReportJsonOfAnotherShape) {
  const fs::path src = tmp_.path / "src";
  CliRun r = run("compress " + model() + " --method rtn-nvfp4 --out '" + src.string() +
                 "' --calib-samples 2 --seq-len 16 --threads 1");
  ASSERT_EQ(r.rc, 0) << r.err;
  int i = 0;
  for (const char* report : {R"({"layers": 5})", R"({"layers": [7, {"layer": "x", "experts": 3}]})",
                             R"({"layers": [{"layer": 0, "experts": [null, {"expert": 0.5}, {"expert": 0, "input_amax": 4}]}]})"}) {
    tmp_.write("src/report.json", report);
    const std::string out = (tmp_.path / ("ct" + std::to_string(i++))).string();
    r = run("export '" + src.string() + "' --format compressed-tensors --out '" + out + "' --json");
    EXPECT_EQ(r.rc, 0) << report << ": " << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
    EXPECT_NE(r.out.find("default 1.0"), std::string::npos) << report << ": " << r.out;
  }
}

// `moesq eval ... --json > result.json` on a full disk exited 0 with an empty result.json: stdout is
// the result, so a failed write of it is an error.
TEST_F(NewUser, AFailedWriteOfStdoutIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const std::string err = tmp_.file("err.txt");
  for (const std::string& args :
       std::vector<std::string>{"tokenize " + model() + " --text hi --json", "inspect " + model() + " --json",
                                "audit schedule --blocks 50 --n 1536 --k 2048 --thread-k 64 --thread-n 128 --json"}) {
    const std::string cmd = std::string("MOESQ_QUIET=1 '") + MOESQ_BINARY + "' " + args + " >/dev/full 2>'" + err + "'";
    const int st = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(st)) << args;
    EXPECT_EQ(WEXITSTATUS(st), 1) << args;
    EXPECT_NE(moesq::test::slurp(err).find("moesq: error: cannot write standard output ("), std::string::npos)
        << args << ": " << moesq::test::slurp(err);
  }
}

// `audit score R R R R R` (one run, five spellings allowed) was ACCEPTED as five identical
// replicates; a run counts once, so listing one twice is a rejection naming it.
TEST_F(NewUser, AuditScoreCountsARunListedTwiceOnce) {
  const std::string r1 = (tmp_.path / "r1").string();
  ASSERT_EQ(run("audit run --fixture small --out '" + r1 + "'").rc, 0);
  const CliRun once = run("audit score --replicates 1 '" + r1 + "'");
  EXPECT_EQ(once.rc, 0) << once.out << once.err;  // the run itself is fine
  const std::string q = "'" + r1 + "' ";
  for (const std::string& again : std::vector<std::string>{r1, r1 + "/", r1 + "/.", (tmp_.path / "." / "r1").string()}) {
    const CliRun r = run("audit score --replicates 2 " + q + "'" + again + "'");
    EXPECT_EQ(r.rc, 1) << again << ": " << r.out;
    EXPECT_NE(r.out.find("REJECTED (replicates): run " + again + " is listed twice (also as " + r1 + ")"),
              std::string::npos)
        << r.out;
  }
}

// A config without max_position_embeddings bounds nothing, and `generate --max-new-tokens 10^12`
// died with "internal error: std::bad_alloc" (exit 2) allocating the KV cache.
TEST_F(NewUser, UnallocatableGenerationNamesTheFlag) {
  const fs::path m = tmp_.path / "m";
  fs::create_directories(m);
  for (const auto& e : fs::directory_iterator(MOESQ_DEFAULT_MODEL))
    if (e.path().filename() != "config.json") fs::create_symlink(e.path(), m / e.path().filename());
  std::string cfg = moesq::test::slurp(fs::path(MOESQ_DEFAULT_MODEL) / "config.json");
  const size_t at = cfg.find("\"max_position_embeddings\": 1024,");
  ASSERT_NE(at, std::string::npos);
  cfg.erase(at, std::string("\"max_position_embeddings\": 1024,").size());
  tmp_.write("m/config.json", cfg);
  const CliRun r = run("generate '" + m.string() + "' --prompt hi --max-new-tokens 1000000000000");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--max-new-tokens 1000000000000: cannot allocate the KV cache for 1000000000002 tokens"),
            std::string::npos)
      << r.err;
}

// A flag error is an error like the others: "moesq: error: ..." naming the flag and the subcommand's
// --help, exit 1 (CLI11 printed its own text and exited 105 / 106 / 109). --help still exits 0.
TEST_F(NewUser, FlagErrorsHaveOneStyleAndExitCode) {
  struct Case { std::string args, needle; };
  for (const Case& c : {Case{"bench e2e --batch", "--batch"}, Case{"eval --seq-len abc . --data y", "--seq-len"},
                        Case{"compress --no-such-flag", "--no-such-flag"}, Case{"nosuchcommand", "nosuchcommand"},
                        Case{"demo --eval-samples 0", "--eval-samples"}, Case{"compress .", "--method is required"},
                        Case{"", "subcommand"}}) {
    const CliRun r = run(c.args);
    EXPECT_EQ(r.rc, 1) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("moesq: error: ", 0), 0u) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find("--help"), std::string::npos) << c.args << "\n" << r.err;
  }
  EXPECT_EQ(run("compress --help").rc, 0);
  EXPECT_EQ(run("--version").rc, 0);
}

// --device cuda on a machine without a GPU said "CUDA driver version is insufficient for CUDA runtime
// version" with a source path, after "loading ... onto the GPU": now it says no device was found and what
// the engine needs (a CUDA build), or that this build has no CUDA. Skipped where a GPU is present.
TEST_F(NewUser, DeviceCudaWithoutAGpuSaysSo) {
  const std::string m = std::string("'") + MOESQ_DEFAULT_MODEL + "'";
  tmp_.write("d.txt", "some text to evaluate on, long enough for one window of eight tokens");
  const std::string d = (tmp_.path / "d.txt").string();
  for (const std::string args : {"eval " + m + " --data " + d + " --seq-len 8 --device cuda",
                                 "generate " + m + " --prompt hi --max-new-tokens 2 --device cuda",
                                 std::string("bench e2e --synthetic qwen3-30b-a3b --layers 1 --batch 1 --gen 4 --prompt-len 4")}) {
    const CliRun r = run(args);
    if (r.rc == 0) GTEST_SKIP() << "a CUDA device is present: " << args;
    EXPECT_EQ(r.rc, 1) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
    const bool no_device = r.err.find("no CUDA device found") != std::string::npos &&
                           r.err.find("Use --device cpu") != std::string::npos;
    const bool no_build = r.err.find("built without CUDA") != std::string::npos;
    EXPECT_TRUE(no_device || no_build) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("onto the GPU"), std::string::npos) << "refused only after loading: " << r.err;
    EXPECT_EQ(r.err.find(".cu:"), std::string::npos) << "a source path in a user error: " << r.err;
  }
}

// demo --out somewhere no directory can be made (a read-only filesystem; /proc here, which refuses even
// root) was "internal error: filesystem error" after the first method's work; now an error naming --out
// before any work.
TEST_F(NewUser, DemoOutThatCannotBeCreatedNamesTheFlag) {
  const CliRun r = run("demo --out /proc/self/moesq-demo-out --eval-samples 1");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--out /proc/self/moesq-demo-out"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[compress]"), std::string::npos) << "refused only after work: " << r.err;
}

// Flags of another method were ignored silently (`--method sgptq --epochs 3` ran plain SGPTQ): now an
// error naming the flag and the method, before the model is loaded.
TEST_F(NewUser, FlagsOfAnotherMethodAreRefusedByName) {
  const std::string m = std::string("'") + MOESQ_DEFAULT_MODEL + "'";
  struct Case { std::string flags, needle; };
  for (const Case& c : {Case{"--method sgptq --epochs 3", "--epochs applies to --method moesq"},
                        Case{"--method rtn-nvfp4 --tau0 2", "--tau0 applies to --method moesq"},
                        Case{"--method jsq --obr-alpha 0.3", "--obr-alpha applies to --method obr"},
                        Case{"--method moesq --jsq-rho 2", "--jsq-rho applies to --method jsq"}}) {
    const CliRun r = run("compress " + m + " " + c.flags + " --out '" + (tmp_.path / "o").string() + "'");
    EXPECT_EQ(r.rc, 1) << c.flags << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.flags << "\n" << r.err;
    EXPECT_EQ(r.err.find("[compress]"), std::string::npos) << "refused only after work: " << r.err;
    EXPECT_FALSE(fs::exists(tmp_.path / "o")) << c.flags;
  }
}

}  // namespace
