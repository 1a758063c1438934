// --check-finite, the GPU engine's debug check for NaN / inf activations (runtime/finite_check.h), on
// the commands that run the engine: generate, eval, serve, bench e2e. Its --help explains it; with
// --device cpu it is refused by name before any work (it checks the GPU engine only); with --device
// cuda it is accepted — on a machine without a GPU the run fails with the no-device error (not a flag
// error), on a GPU it runs the clean fixture to the end (the check finds nothing there).
// The finding itself (the layer / expert / token the error names) is tested on the GPU by
// tests/gpu/test_engine_check_finite.cu, and its message on the CPU by test_runtime_finite_check.
#include <gtest/gtest.h>

#include <string>

#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace {

using moesq::test::CliRun;

class CliCheckFinite : public ::testing::Test {
 protected:
  moesq::test::TempDir tmp_{"moesq_test_check_finite"};
  CliRun run(const std::string& args) { return moesq::test::run_moesq(args, tmp_.path.string()); }
  std::string model() const { return std::string("'") + MOESQ_DEFAULT_MODEL + "'"; }
  std::string data() const {
    return "'" + tmp_.write("d.txt", "some text to evaluate on, long enough for a window or two of eight tokens") + "'";
  }
};

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST_F(CliCheckFinite, HelpOfEveryGpuCommandExplainsIt) {
  for (const char* cmd : {"generate", "eval", "serve", "bench e2e"}) {
    const CliRun r = run(std::string(cmd) + " --help");
    EXPECT_EQ(r.rc, 0) << cmd << "\n" << r.err;
    EXPECT_TRUE(has(r.out, "--check-finite")) << cmd << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "NaN or inf")) << cmd << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "naming the layer, the stage, the expert and the token")) << cmd << "\n" << r.out;
    EXPECT_TRUE(has(r.out, "costs nothing")) << cmd << "\n" << r.out;
  }
}

TEST_F(CliCheckFinite, DeviceCpuRefusesItByName) {
  for (const std::string& args : {"generate " + model() + " --prompt 'the ' --max-new-tokens 2 --check-finite",
                                 "eval " + model() + " --data " + data() + " --seq-len 8 --check-finite",
                                 "serve " + model() + " --port 0 --check-finite"}) {
    const CliRun r = run(args);
    EXPECT_EQ(r.rc, 1) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "moesq: error: --check-finite applies to --device cuda only")) << args << "\n" << r.err;
    EXPECT_FALSE(has(r.err, "internal error")) << r.err;
    EXPECT_FALSE(has(r.err, "listening")) << "refused only after starting: " << r.err;
    EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
  }
}

// Accepted with --device cuda: here either the no-GPU error (this machine has no GPU: the flag was
// parsed and the run went as far as any --device cuda run) or, on a GPU, a clean run of the fixture.
TEST_F(CliCheckFinite, DeviceCudaAcceptsIt) {
  for (const std::string& args :
       {"generate " + model() + " --prompt 'the ' --max-new-tokens 4 --device cuda --check-finite --json",
        "eval " + model() + " --data " + data() + " --seq-len 8 --device cuda --check-finite --json",
        std::string("bench e2e --synthetic qwen3-30b-a3b --layers 1 --batch 1 --gen 4 --prompt-len 4 "
                    "--check-finite")}) {
    const CliRun r = run(args);
    EXPECT_FALSE(has(r.err, "check-finite")) << "the flag was refused: " << args << "\n" << r.err;
    EXPECT_FALSE(has(r.err, "internal error")) << r.err;
    if (r.rc == 0) continue;  // a GPU: the clean fixture has no NaN, the check found nothing
    EXPECT_EQ(r.rc, 1) << args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "no CUDA device found") || has(r.err, "built without CUDA")) << args << "\n" << r.err;
  }
}

}  // namespace
