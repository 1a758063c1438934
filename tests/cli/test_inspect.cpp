// `moesq inspect` end to end: runs the built binary and checks its JSON against numbers computed
// here independently — config.json read with nlohmann, safetensors headers parsed by a few lines of
// code below (not src/io), the parameter total against the total_parameters transformers wrote in
// the index — on the embedded model and on a small synthetic compressed checkpoint (logical
// parameter counts, bits per expert weight measured from bytes), and the per-projection section of
// every family fixture (the family's own projection names). A bad directory must exit non-zero with
// a message naming it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Relative tolerance for the floating ratios printed in JSON (shares, bits/weight): they are
// computed from the same integers here, so only printing/rounding of doubles may differ.
constexpr double kRatioRtol = 1e-12;

struct RunResult {
  int rc = -1;
  std::string out, err;
};

RunResult run_moesq(const std::string& args) {
  char tmpl[] = "/tmp/moesq_cli_inspect_err_XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  const std::string cmd = std::string("'") + MOESQ_BINARY + "' " + args + " 2>" + tmpl;
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(tmpl);
  r.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  fs::remove(tmpl);
  return r;
}

// Independent header parse: {name: {dtype, shape, data_offsets}} of every safetensors file in dir.
std::map<std::string, json> read_headers(const fs::path& dir) {
  std::map<std::string, json> all;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".safetensors") continue;
    std::ifstream in(e.path(), std::ios::binary);
    uint64_t n = 0;
    in.read(reinterpret_cast<char*>(&n), 8);
    std::string text(n, '\0');
    in.read(text.data(), static_cast<std::streamsize>(n));
    const json header = json::parse(text);  // named: a temporary would die before the loop body
    for (const auto& [k, v] : header.items()) {
      if (k != "__metadata__") all[k] = v;
    }
  }
  return all;
}

int64_t numel(const json& info) {
  int64_t n = 1;
  for (const auto& d : info["shape"]) n *= d.get<int64_t>();
  return n;
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "moesq_cli_inspect_XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

TEST(CliInspect, EmbeddedModelJson) {
  const fs::path dir = MOESQ_DEFAULT_MODEL;
  const RunResult r = run_moesq("inspect '" + dir.string() + "' --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json got = json::parse(r.out);
  const json cfg = json::parse(std::ifstream(dir / "config.json"));
  const json index = json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  const auto headers = read_headers(dir);

  EXPECT_EQ(got["architecture"], cfg["model_type"]);
  EXPECT_EQ(got["layers"], cfg["num_hidden_layers"]);
  EXPECT_EQ(got["experts"], cfg["num_local_experts"]);
  EXPECT_EQ(got["top_k"], cfg["num_experts_per_tok"]);
  EXPECT_EQ(got["hidden_size"], cfg["hidden_size"]);
  EXPECT_EQ(got["moe_intermediate_size"], cfg["moe_intermediate_size"]);
  EXPECT_EQ(got["tensors"].get<size_t>(), headers.size());
  EXPECT_EQ(got["tensors"].get<size_t>(), index["weight_map"].size());
  std::set<std::string> shard_files;
  for (const auto& [tensor, shard] : index["weight_map"].items()) shard_files.insert(shard.get<std::string>());
  EXPECT_EQ(got["shards"].get<size_t>(), shard_files.size());
  EXPECT_FALSE(got["compressed"].get<bool>());

  int64_t total = 0, experts = 0;
  std::map<std::string, int64_t> dtype_count;
  for (const auto& [name, info] : headers) {
    total += numel(info);
    if (name.find(".mlp.experts.") != std::string::npos) experts += numel(info);
    ++dtype_count[info["dtype"].get<std::string>()];
  }
  ASSERT_GT(experts, 0);
  EXPECT_EQ(got["parameters"]["total"].get<int64_t>(), total);
  EXPECT_EQ(got["parameters"]["total"].get<int64_t>(), index["metadata"]["total_parameters"].get<int64_t>());
  EXPECT_EQ(got["parameters"]["routed_experts"].get<int64_t>(), experts);
  // Routed experts = layers × experts × 3 projections × (I × H).
  EXPECT_EQ(experts, cfg["num_hidden_layers"].get<int64_t>() * cfg["num_local_experts"].get<int64_t>() * 3 *
                         cfg["moe_intermediate_size"].get<int64_t>() * cfg["hidden_size"].get<int64_t>());
  EXPECT_NEAR(got["parameters"]["expert_share"].get<double>(), double(experts) / double(total), kRatioRtol);
  EXPECT_NEAR(got["expert_bits_per_weight"].get<double>(), 16.0, 16.0 * kRatioRtol);  // bf16 experts
  ASSERT_EQ(got["dtypes"].size(), dtype_count.size());
  for (const auto& [dt, n] : dtype_count) EXPECT_EQ(got["dtypes"][dt]["tensors"].get<int64_t>(), n) << dt;

  // The text form carries the same facts.
  const RunResult text = run_moesq("inspect '" + dir.string() + "'");
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("qwen3_moe"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(std::to_string(total)), std::string::npos) << text.out;
}

// Every family fixture (tests/fixtures/families/tiny-*, and the embedded tiny Qwen3-MoE) lists its
// routed-expert projections under the family's own names — Mixtral's w1 / w3 / w2 under
// block_sparse_moe, gate_proj / up_proj / down_proj elsewhere, gpt-oss's fused gate_up_proj split in
// two — with count and bytes recounted here from the safetensors headers.
TEST(CliInspect, EveryFamilyFixtureListsItsExpertProjections) {
  std::vector<fs::path> dirs = {fs::path(MOESQ_DEFAULT_MODEL)};
  for (const auto& e : fs::directory_iterator(fs::path(MOESQ_FIXTURES) / "families")) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("tiny-", 0) == 0 && !name.ends_with("-reference")) dirs.push_back(e.path());
  }
  ASSERT_GE(dirs.size(), 8u) << "family fixtures missing under " << MOESQ_FIXTURES;
  for (const fs::path& dir : dirs) {
    const RunResult r = run_moesq("inspect '" + dir.string() + "' --json");
    ASSERT_EQ(r.rc, 0) << dir << ": " << r.err;
    const json got = json::parse(r.out);
    const json cfg = json::parse(std::ifstream(dir / "config.json"));
    const bool mixtral = cfg["model_type"] == "mixtral";
    const std::set<std::string> want_names =
        mixtral ? std::set<std::string>{"w1", "w2", "w3"} : std::set<std::string>{"down_proj", "gate_proj", "up_proj"};
    // Independent count: "….experts.{e}.{proj}.weight" per expert, or the fused [E, ·, ·] weights.
    std::map<std::string, std::pair<int64_t, int64_t>> want;  // proj → (projections, bytes)
    for (const auto& [name, info] : read_headers(dir)) {
      const int64_t bytes = info["data_offsets"][1].get<int64_t>() - info["data_offsets"][0].get<int64_t>();
      const size_t at = name.find(".experts.");
      if (at == std::string::npos || name.ends_with("_bias") || name.ends_with(".bias")) continue;
      const std::string rest = name.substr(at + 9);
      if (rest == "gate_up_proj" || rest == "down_proj") {  // fused: [E, H, 2I] or [E, I, H]
        const int64_t E = info["shape"][0].get<int64_t>();
        for (const char* p : rest == "down_proj" ? std::vector<const char*>{"down_proj"}
                                                 : std::vector<const char*>{"gate_proj", "up_proj"}) {
          want[p].first += E;
          want[p].second += rest == "down_proj" ? bytes : bytes / 2;
        }
        continue;
      }
      const size_t dot = rest.find('.');
      if (dot == std::string::npos || rest.substr(rest.find('.', dot + 1) + 1) != "weight") continue;
      const std::string proj = rest.substr(dot + 1, rest.find('.', dot + 1) - dot - 1);
      ++want[proj].first;
      want[proj].second += bytes;
    }
    const json& p = got["projections"];
    ASSERT_EQ(p.size(), 3u) << dir << ": " << p.dump();
    const int64_t per_projection = got["moe_layers"].get<int64_t>() * got["experts"].get<int64_t>();
    const int64_t H = got["hidden_size"].get<int64_t>(), I = got["moe_intermediate_size"].get<int64_t>();
    for (const std::string& name : want_names) {
      ASSERT_TRUE(p.contains(name)) << dir << ": no " << name << " in " << p.dump();
      const json& v = p[name];
      EXPECT_EQ(v["count"].get<int64_t>(), per_projection) << dir << " " << name;
      EXPECT_EQ(v["count"].get<int64_t>(), want[name].first) << dir << " " << name;
      EXPECT_EQ(v["bytes"].get<int64_t>(), want[name].second) << dir << " " << name;
      const bool down = name == "down_proj" || name == "w2";
      EXPECT_EQ(v["shape"], json::array({down ? H : I, down ? I : H})) << dir << " " << name;
      EXPECT_EQ(v["storage"], json({{"bf16", per_projection}})) << dir << " " << name;
      EXPECT_NEAR(v["bits_per_weight"].get<double>(), 16.0, 16.0 * kRatioRtol) << dir << " " << name;
    }
  }
}

TEST(CliInspect, CompressedCheckpointCountsLogicalWeights) {
  // A one-layer, two-expert checkpoint laid out as paired 4:8 NVFP4 (docs/FORMAT.md).
  TempDir dir;
  json cfg = json::parse(std::ifstream(fs::path(MOESQ_DEFAULT_MODEL) / "config.json"));
  const int64_t H = 64, I = 32, E = 2;
  cfg["num_hidden_layers"] = 1;
  cfg["hidden_size"] = H;
  cfg["moe_intermediate_size"] = I;
  cfg["num_local_experts"] = E;
  cfg["num_experts_per_tok"] = 2;
  cfg["quantization_config"] = {{"quant_method", "moesq"}, {"format", "paired-4:8-nvfp4"}, {"weight_block_size", 32}};
  std::ofstream(dir.path / "config.json") << cfg.dump(2);

  std::mt19937 rng(21);
  moesq::io::SafetensorsWriter w;
  auto add = [&](const std::string& name, moesq::io::DType dt, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * moesq::io::dtype_size(dt));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng() & 0x3f);
    w.add(name, dt, shape, bytes.data(), bytes.size());
  };
  using moesq::io::DType;
  add("model.embed_tokens.weight", DType::BF16, {256, H});
  add("model.layers.0.mlp.gate.weight", DType::BF16, {E, H});
  for (int e = 0; e < E; ++e) {
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::strcmp(proj, "down_proj") == 0;
      const int64_t N = down ? H : I, K = down ? I : H;
      const std::string p = "model.layers.0.mlp.experts." + std::to_string(e) + "." + proj;
      add(p + ".weight_packed", DType::U8, {N, K / 4});
      add(p + ".weight_meta", DType::U8, {N, K / 16});
      add(p + ".weight_scale", DType::F8_E4M3, {N, K / 32});
      add(p + ".weight_global_scale", DType::F32, {1});
    }
  }
  w.write((dir.path / "model.safetensors").string());

  const RunResult r = run_moesq("inspect '" + dir.path.string() + "' --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const json got = json::parse(r.out);
  EXPECT_TRUE(got["compressed"].get<bool>());
  EXPECT_EQ(got["quantization_config"]["format"], "paired-4:8-nvfp4");
  const int64_t logical_experts = E * 3 * I * H;
  const int64_t non_expert = 256 * H + E * H;
  EXPECT_EQ(got["parameters"]["routed_experts"].get<int64_t>(), logical_experts);
  EXPECT_EQ(got["parameters"]["total"].get<int64_t>(), logical_experts + non_expert);
  EXPECT_EQ(got["expert_projections"].get<int64_t>(), E * 3);
  int64_t expert_bytes = 0;
  for (const auto& [name, info] : read_headers(dir.path)) {
    if (name.find(".mlp.experts.") == std::string::npos) continue;
    expert_bytes += info["data_offsets"][1].get<int64_t>() - info["data_offsets"][0].get<int64_t>();
  }
  const double bpw = 8.0 * double(expert_bytes) / double(logical_experts);
  EXPECT_NEAR(got["expert_bits_per_weight"].get<double>(), bpw, bpw * kRatioRtol);
  // 2.75 bits from the packed data + the per-projection f32 global scale.
  const double bpw_formula = 2.75 + 32.0 * E * 3 / double(logical_experts);  // paper Eq. 7 + scales
  EXPECT_NEAR(bpw, bpw_formula, bpw_formula * kRatioRtol);
  EXPECT_EQ(got["dtypes"]["F8_E4M3"]["tensors"].get<int64_t>(), E * 3);
}

TEST(CliInspect, BadDirectoryFails) {
  const std::string missing = "/nonexistent/moesq-inspect-dir";
  const RunResult r = run_moesq("inspect " + missing + " --json");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;

  // A directory with a config but a truncated shard: the message names the shard file.
  TempDir dir;
  fs::copy_file(fs::path(MOESQ_DEFAULT_MODEL) / "config.json", dir.path / "config.json");
  std::ofstream(dir.path / "model.safetensors") << "\x08\x00";
  const RunResult r2 = run_moesq("inspect '" + dir.path.string() + "'");
  EXPECT_NE(r2.rc, 0);
  EXPECT_NE(r2.err.find((dir.path / "model.safetensors").string()), std::string::npos) << r2.err;
}

// A config.json that disagrees with the tensors inspected with believable wrong figures ("bf16 (8.000
// bits/weight)" for hidden_size twice the stored width; 64 experts claimed over 32 stored): now an error
// naming the tensor or the expert and the config field, like eval's.
TEST(CliInspect, ConfigThatDisagreesWithTheTensorsIsAnError) {
  const json base = json::parse(std::ifstream(fs::path(MOESQ_DEFAULT_MODEL) / "config.json"));
  struct Case { std::string key; int64_t factor; std::string needle; };
  // Checked before anything is sized by config.json (io::check_config_against_tensors): the first tensor
  // each field describes.
  for (const Case& c : {Case{"hidden_size", 2, "tensor model.embed_tokens.weight has shape [256, 256] but config.json "
                                               "(vocab_size x hidden_size) says [256, 512]"},
                        Case{"num_local_experts", 2, "tensor model.layers.0.mlp.gate.weight has shape [32, 256] but "
                                                     "config.json (num_experts x hidden_size) says [64, 256]"}}) {
    TempDir dir;
    for (const auto& e : fs::directory_iterator(MOESQ_DEFAULT_MODEL))
      if (e.path().filename() != "config.json") fs::create_symlink(e.path(), dir.path / e.path().filename());
    json cfg = base;
    cfg[c.key] = base[c.key].get<int64_t>() * c.factor;
    std::ofstream(dir.path / "config.json") << cfg.dump(2);
    const RunResult r = run_moesq("inspect '" + dir.path.string() + "' --json");
    EXPECT_NE(r.rc, 0) << c.key << ": " << r.out;
    EXPECT_TRUE(r.out.empty()) << c.key << ": " << r.out;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.key << ": " << r.err;
  }
}

namespace {

// A mistyped command word is named in the error (CLI11 alone would only say that a subcommand is
// required), at the top level and under a command group; no output on stdout.
TEST(CliMain, UnknownCommandWordIsNamed) {
  for (const std::string args : {"frobnicate", "bench frobnicate", "audit frobnicate"}) {
    const RunResult r = run_moesq(args);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_NE(r.err.find("'frobnicate'"), std::string::npos) << args << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << args << ": " << r.out;
  }
  const RunResult none = run_moesq("bench");  // nothing mistyped: CLI11's own message stays
  EXPECT_NE(none.rc, 0);
  EXPECT_NE(none.err.find("subcommand"), std::string::npos) << none.err;
}

}  // namespace
