// `moesq bench compress --synthetic`: Algorithm 1 on a synthetic model of Qwen3-30B-A3B's exact shapes
// (here 2 of its 48 layers, 8 of its 128 experts, a tiny calibration: CPU-sized), per-layer stage seconds
// in the JSON that add up, the whole model extrapolated from them, and flag errors that name the flag.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace {

using moesq::test::run_cli;

TEST(CliBenchCompress, StagesPerLayerAddUpAndTheModelIsExtrapolated) {
  const moesq::test::TempDir tmp("moesq_bench_compress");
  const auto r = run_cli(MOESQ_BINARY,
                         "bench compress --synthetic qwen3-30b-a3b --layers 2 --num-experts 8 --methods magnitude,sgptq "
                         "--device cpu --calib-samples 2 --seq-len 8 --threads 2 --json",
                         tmp.path);
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);  // stdout is the JSON object alone
  EXPECT_EQ(j["model_layers"], 48);
  EXPECT_EQ(j["layers_run"], 2);
  EXPECT_EQ(j["num_experts"], 8);
  EXPECT_EQ(j["hidden_size"], 2048);
  EXPECT_EQ(j["moe_intermediate_size"], 768);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["method"], "magnitude");
  EXPECT_EQ(j["runs"][1]["method"], "sgptq");
  for (const auto& run : j["runs"]) {
    EXPECT_EQ(run["device"], "cpu");
    ASSERT_EQ(run["layers"].size(), 2u);
    double sum = 0;
    std::vector<double> totals;
    for (const auto& l : run["layers"]) {
      const double routing = l["routing_s"], experts = l["experts_s"], propagation = l["propagation_s"];
      EXPECT_GT(routing, 0.0);
      EXPECT_GT(experts, 0.0);
      EXPECT_GT(propagation, 0.0);
      EXPECT_NEAR(l["total_s"].get<double>(), routing + experts + propagation, 1e-9);
      sum += l["total_s"].get<double>();
      totals.push_back(l["total_s"].get<double>());
    }
    EXPECT_NEAR(run["mean_layer_s"].get<double>(), sum / 2, 1e-9);
    // Every layer of Qwen3-30B-A3B is an MoE layer: the first counts once, the other 47 at the later
    // layers' mean (here layer 2's time).
    EXPECT_NEAR(run["later_moe_layer_s"].get<double>(), totals[1], 1e-9);
    EXPECT_NEAR(run["model_extrapolated_s"].get<double>(), totals[0] + 47 * totals[1], 1e-6);
    EXPECT_GT(run["peak_host_gb"].get<double>(), 0.0);
    EXPECT_TRUE(run["peak_gpu_gb"].is_null());  // measured on the GPU only
  }
  // SGPTQ's expert stage is made of its solve: the summed per-expert worker time says so.
  EXPECT_GT(j["runs"][1]["layers"][0]["expert_stages_summed_s"]["solve"].get<double>(), 0.0);
  EXPECT_NE(r.err.find("layer 1: routing"), std::string::npos) << r.err;  // the table went to stderr
}

TEST(CliBenchCompress, BadFlagsNameTheFlag) {
  const moesq::test::TempDir tmp("moesq_bench_compress_bad");
  struct Case {
    std::string args, says;
  };
  const Case cases[] = {
      {"--synthetic qwen3-30b-a3b --layers 49", "--layers"},
      {"--synthetic qwen3-30b-a3b --num-experts 4", "--num-experts"},
      {"--synthetic llama-70b", "--synthetic"},
      {"--synthetic qwen3-30b-a3b --methods sgptq,nope", "nope"},
      {"--synthetic qwen3-30b-a3b --methods jsq --device cuda", "--device cuda"},
      {"--synthetic qwen3-next-80b-a3b", "its Gated DeltaNet layers have no synthetic CPU model yet"},
      {"--synthetic qwen3.5-397b-a17b", "its Gated DeltaNet layers have no synthetic CPU model yet"},
  };
  for (const Case& c : cases) {
    const std::string device = c.args.find("--device") == std::string::npos ? " --device cpu" : "";
    const auto r = run_cli(MOESQ_BINARY, "bench compress " + c.args + device + " --calib-samples 2 --seq-len 8", tmp.path);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << ": " << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << c.args << ": " << r.err;
  }
}

}  // namespace
