// Sizes from config.json are untrusted: a config claiming 10^12 layers, 2^40 experts, a 10^12-token
// vocabulary or 2^40 heads over the tiny model's tensors made `eval` ask for terabytes
// (`internal error: std::bad_alloc`, exit 2) and `inspect` loop for hours. Now each is an Error
// naming the config field (and the tensor it disagrees with), exit 1, before anything is allocated.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A copy of the tiny model (tensors linked) whose config.json is edited by `edit`.
std::string edited_copy(const fs::path& dst, const std::function<void(json&)>& edit) {
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(MOESQ_DEFAULT_MODEL))
    if (e.path().filename() != "config.json") fs::create_symlink(e.path(), dst / e.path().filename());
  std::ifstream in(fs::path(MOESQ_DEFAULT_MODEL) / "config.json");
  json cfg = json::parse(in);
  edit(cfg);
  std::ofstream(dst / "config.json") << cfg.dump(2);
  return dst.string();
}

TEST(CliConfigSizes, SizesThatDisagreeWithTheTensorsAreErrorsNamingTheField) {
  moesq::test::TempDir dir("moesq_config_sizes");
  const std::string text = dir.write("t.txt", "hello world hello world hello world hello world\n");
  const int64_t big = int64_t{1} << 40;
  const std::vector<std::pair<std::function<void(json&)>, std::vector<std::string>>> cases = {
      {[](json& c) { c["num_hidden_layers"] = 1000000000000LL; }, {"num_hidden_layers = 1000000000000", "65536"}},
      {[&](json& c) { c["num_local_experts"] = big; }, {"routed experts (1099511627776)"}},
      {[](json& c) { c["num_hidden_layers"] = 5; }, {"num_hidden_layers = 5", "no tensor is named model.layers.4.*"}},
      {[](json& c) { c["vocab_size"] = 1000000000000LL; }, {"model.embed_tokens.weight", "vocab_size x hidden_size"}},
      {[](json& c) { c["num_local_experts"] = 64; }, {"model.layers.0.mlp.gate.weight", "num_experts x hidden_size"}},
      {[&](json& c) { c["head_dim"] = big; }, {"model.layers.0.self_attn.k_proj.weight", "head_dim"}},
      {[&](json& c) { c["num_attention_heads"] = big; }, {"model.layers.0.self_attn.o_proj.weight", "num_attention_heads"}},
      {[](json& c) {  // the per-layer window table is sized after the layer count is checked
         c["num_hidden_layers"] = 1000000000000LL;
         c["use_sliding_window"] = true;
         c["sliding_window"] = 16;
       },
       {"num_hidden_layers = 1000000000000"}},
  };
  int i = 0;
  for (const auto& [edit, want] : cases) {
    const std::string ckpt = edited_copy(dir.path / ("c" + std::to_string(i++)), edit);
    for (const std::string& cmd : {"inspect " + ckpt, "eval " + ckpt + " --data " + text + " --seq-len 8"}) {
      // `timeout`: inspect used to run for hours on the first two
      const moesq::test::CliRun r = moesq::test::run_cli("timeout", "60 '" + std::string(MOESQ_BINARY) + "' " + cmd, dir.path);
      EXPECT_EQ(r.rc, 1) << cmd << ": " << r.err;
      EXPECT_EQ(r.err.find("internal error"), std::string::npos) << cmd << ": " << r.err;
      EXPECT_NE(r.err.find("moesq: error: "), std::string::npos) << cmd << ": " << r.err;
      for (const std::string& w : want) EXPECT_NE(r.err.find(w), std::string::npos) << cmd << ": " << r.err;
    }
  }
}

}  // namespace
