// Tensors the model does not run are never dropped by `compress`: a DeepSeek-V3 checkpoint that ships its
// multi-token-prediction layer (`model.layers.{num_hidden_layers}.*`, with routed experts, as DeepSeek-V3
// ships layer 61) is made from the tiny deepseek fixture by copying its last MoE layer to layer N plus the
// MTP-only tensors (eh_proj, enorm, hnorm, shared_head). The test walks EVERY tensor of the source and
// checks it is in the output: a compressed routed-expert projection as `.weight_packed` (+ scales), every
// other tensor — the extra layer's routed experts included — byte-identical; report.json lists the copied
// experts, stderr says so, and the compressed-tensors export keeps them (as ignored modules).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"
#include "support/cli_run.h"
#include "support/npy.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string fixture(const std::string& name) { return std::string(MOESQ_FIXTURES) + "/families/" + name; }

// Copies tiny-deepseek-v3 to `dst` and adds layer N = num_hidden_layers: every tensor of the last layer
// renamed, plus the MTP-only tensors, in a shard of its own listed in the index.
void make_mtp_copy(const std::string& src_dir, const fs::path& dst) {
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src_dir)) fs::copy_file(e.path(), dst / e.path().filename());
  const moesq::io::Checkpoint src(src_dir);
  const int64_t N = src.spec().num_layers, H = src.spec().hidden_size;
  const std::string last = "model.layers." + std::to_string(N - 1) + ".";
  moesq::io::SafetensorsWriter w;
  for (const std::string& n : src.names()) {
    if (n.rfind(last, 0) != 0) continue;
    const moesq::io::TensorView& t = src.get(n);
    w.add(moesq::io::layer_tensor(N, n.substr(last.size())), t.dtype, t.shape, t.data, t.nbytes);
  }
  // DeepSeek-V3's MTP module: eh_proj [H, 2H], enorm / hnorm [H], shared_head.norm [H] (bf16 ones).
  std::vector<float> eh(static_cast<size_t>(2 * H * H));
  for (size_t i = 0; i < eh.size(); ++i) eh[i] = 0.01f * static_cast<float>(static_cast<int>(i % 37) - 18);
  w.add_f32(moesq::io::layer_tensor(N, "eh_proj.weight"), {H, 2 * H}, eh);
  for (const char* rest : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight"})
    w.add_f32(moesq::io::layer_tensor(N, rest), {H}, std::vector<float>(static_cast<size_t>(H), 1.0f));
  const std::string shard = "model-mtp.safetensors";
  w.write((dst / shard).string());
  std::ifstream is(dst / "model.safetensors.index.json");
  json index = json::parse(is);
  for (const std::string& n : w.names()) index["weight_map"][n] = shard;
  std::ofstream(dst / "model.safetensors.index.json") << index.dump(2);
}

// The reference's input_ids as one int32 .npy for --calib.
std::string calib_ids(const moesq::test::TempDir& dir, int64_t* T) {
  moesq::io::SafetensorsFile f(fixture("tiny-deepseek-v3-reference") + "/reference.safetensors");
  const moesq::io::TensorView& ids = f.get("input_ids");
  *T = ids.shape.at(1);
  const std::vector<float> idf = moesq::io::to_f32(ids);
  return dir.write("ids.npy", moesq::test::npy_int32(std::vector<int32_t>(idf.begin(), idf.end())));
}

bool same_bytes(const moesq::io::TensorView& a, const moesq::io::TensorView& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes && std::memcmp(a.data, b.data, a.nbytes) == 0;
}

// Every tensor of `src` is in `dst`: packed when compression replaces it, else byte-identical.
// Returns the names copied although they are routed-expert tensors.
std::vector<std::string> check_every_source_tensor(const moesq::io::Checkpoint& src, const moesq::io::Checkpoint& dst) {
  std::vector<std::string> copied_experts;
  for (const std::string& n : src.names()) {
    if (moesq::io::is_compressed_expert_tensor(src.spec(), n)) {
      if (n.size() <= 7 || n.compare(n.size() - 7, 7, ".weight") != 0) {
        ADD_FAILURE() << n << ": a routed-expert source tensor that is not a dense .weight";
        continue;
      }
      const std::string prefix = n.substr(0, n.size() - 7);
      EXPECT_TRUE(dst.has(prefix + ".weight_packed") && dst.has(prefix + ".weight_scale") &&
                  dst.has(prefix + ".weight_global_scale"))
          << n << ": a compressed routed-expert projection is not packed in the output";
      EXPECT_FALSE(dst.has(n)) << n << ": packed and also copied";
      continue;
    }
    if (!dst.has(n)) {
      ADD_FAILURE() << n << ": in the source, not in the output (neither packed nor copied)";
      continue;
    }
    EXPECT_TRUE(same_bytes(src.get(n), dst.get(n))) << n << ": copied but not byte-identical";
    if (moesq::io::is_expert_tensor(n)) copied_experts.push_back(n);
  }
  return copied_experts;
}

class CliExtraLayers : public ::testing::TestWithParam<bool> {};

TEST_P(CliExtraLayers, EveryTensorOfTheSourceIsInTheOutputPackedOrCopied) {
  const bool with_mtp = GetParam();
  moesq::test::TempDir dir("moesq_extra_layers");
  std::string src_dir = fixture("tiny-deepseek-v3");
  if (with_mtp) {
    make_mtp_copy(src_dir, dir.path / "src");
    src_dir = (dir.path / "src").string();
  }
  const moesq::io::Checkpoint src(src_dir);
  const int64_t N = src.spec().num_layers;
  std::vector<std::string> extra_experts;  // the routed-expert tensors of layer N
  for (const std::string& n : src.names())
    if (moesq::io::is_expert_tensor(n) && n.rfind("model.layers." + std::to_string(N) + ".", 0) == 0)
      extra_experts.push_back(n);
  ASSERT_EQ(extra_experts.size(), with_mtp ? static_cast<size_t>(3 * src.spec().num_experts) : 0u);

  int64_t T = 0;
  const std::string ids = calib_ids(dir, &T);
  const std::string out = dir.file("out");
  const moesq::test::CliRun r =
      moesq::test::run_moesq("compress " + src_dir + " --method sgptq --out " + out + " --calib " + ids +
                                 " --calib-samples 2 --seq-len " + std::to_string(T),
                             dir.path.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const moesq::io::Checkpoint dst(out);
  std::vector<std::string> copied = check_every_source_tensor(src, dst);
  std::sort(copied.begin(), copied.end());
  EXPECT_EQ(copied, extra_experts) << "the copied routed-expert tensors are exactly layer " << N << "'s";

  std::ifstream rf(out + "/report.json");
  const json rep = json::parse(rf);
  ASSERT_TRUE(rep.contains("copied_expert_tensors"));
  EXPECT_EQ(rep["copied_expert_tensors"].get<std::vector<std::string>>(), extra_experts);
  const bool noted = r.err.find("copied whole, not compressed") != std::string::npos &&
                     r.err.find("model.layers." + std::to_string(N) + ".*") != std::string::npos;
  EXPECT_EQ(noted, with_mtp) << r.err;
  // bits/weight counts the compressed projections only (a bf16 copy would raise it past 16 / 4 = 4).
  EXPECT_LT(rep["bits_per_expert_weight"].get<double>(), 4.0);

  // The compressed output evaluates, and its compressed-tensors export keeps the copied experts,
  // listed as ignored (unquantized) modules.
  for (const std::string& dirname : {src_dir, out}) {  // inspect counts the extra layer as kept, not as experts
    const moesq::test::CliRun ins = moesq::test::run_moesq("inspect " + dirname + " --json", dir.path.string());
    ASSERT_EQ(ins.rc, 0) << dirname << ": " << ins.err;
    const json j = json::parse(ins.out);
    EXPECT_EQ(j["expert_projections"], j["expert_projections_expected"]) << dirname;
    EXPECT_EQ(j["not_compressed"]["copied_expert"].get<size_t>(), extra_experts.size()) << dirname;
    if (dirname == out) {
      EXPECT_LT(j["expert_bits_per_weight"].get<double>(), 4.0) << "the bf16 copies counted as compressed experts";
      EXPECT_EQ(j["not_compressed"], rep["not_compressed"]) << "report and inspect disagree";
    }
  }
  const moesq::test::CliRun ev = moesq::test::run_moesq(
      "eval " + out + " --data " + ids + " --seq-len " + std::to_string(T) + " --json", dir.path.string());
  EXPECT_EQ(ev.rc, 0) << ev.err;
  const std::string ct = dir.file("ct");
  const moesq::test::CliRun x =
      moesq::test::run_moesq("export " + out + " --format compressed-tensors --out " + ct, dir.path.string());
  ASSERT_EQ(x.rc, 0) << x.err;
  std::ifstream cf(ct + "/config.json");
  const json ignore = json::parse(cf)["quantization_config"]["ignore"];
  const moesq::io::Checkpoint exported(ct);
  for (const std::string& n : extra_experts) {
    ASSERT_TRUE(exported.has(n)) << n << ": dropped by the compressed-tensors export";
    EXPECT_TRUE(same_bytes(src.get(n), exported.get(n))) << n;
    const std::string mod = n.substr(0, n.rfind('.'));
    EXPECT_NE(std::find(ignore.begin(), ignore.end(), mod), ignore.end()) << mod << " is not in the ignore list";
  }
}

INSTANTIATE_TEST_SUITE_P(DeepseekV3, CliExtraLayers, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "WithMtpLayer" : "AsShipped"; });

}  // namespace
