// The Qwen3.5-MoE hub layout end to end (io/hub_layout.h): a hub-layout checkpoint built in the test
// from the per-expert fixture (tests/support/hub_checkpoint.h) must run exactly as the fixture —
// DecoderModel forward bitwise identical, `moesq eval` equal, `inspect` finding every routed expert —
// and `moesq compress --method sgptq` on it must write the stated layout: the source's nesting and
// wrapper config (quantization_config at the top), routed experts PER EXPERT under
// "model.language_model.…experts.{e}.{proj}" with the same packed bytes as compressing the fixture,
// every other stored tensor (vision and MTP ones included) byte-identical; the output evaluates.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"
#include "model/decoder.h"
#include "support/cli_run.h"
#include "support/hub_checkpoint.h"
#include "support/npy.h"
#include "support/temp_dir.h"

namespace {

using nlohmann::json;
using moesq::io::Checkpoint;

std::string fixture() { return std::string(MOESQ_FIXTURES) + "/families/tiny-qwen3.5-moe"; }

struct HubCase : ::testing::Test {
  void SetUp() override {
    flat_ = std::make_unique<Checkpoint>(fixture());
    hub_dir_ = tmp_.file("hub");
    std::filesystem::create_directory(hub_dir_);
    moesq::test::write_hub_checkpoint(*flat_, hub_dir_);
    moesq::io::SafetensorsFile ref(fixture() + "-reference/reference.safetensors");
    const moesq::io::TensorView& idv = ref.get("input_ids");
    B_ = idv.shape.at(0);
    T_ = idv.shape.at(1);
    const std::vector<float> idf = moesq::io::to_f32(idv);
    ids_.assign(idf.begin(), idf.end());
    ids_file_ = tmp_.write("ids.npy", moesq::test::npy_int32(ids_));
  }
  moesq::test::CliRun moesq(const std::string& args) { return moesq::test::run_moesq(args, tmp_.path.string()); }
  double eval_nats(const std::string& dir) {
    const moesq::test::CliRun r =
        moesq("eval '" + dir + "' --data '" + ids_file_ + "' --seq-len " + std::to_string(T_) + " --json");
    EXPECT_EQ(r.rc, 0) << r.err;
    return r.rc == 0 ? json::parse(r.out)["nats_per_token"].get<double>() : NAN;
  }
  moesq::test::TempDir tmp_{"moesq_cli_hub"};
  std::unique_ptr<Checkpoint> flat_;
  std::string hub_dir_, ids_file_;
  std::vector<int32_t> ids_;
  int64_t B_ = 0, T_ = 0;
};

TEST_F(HubCase, ForwardIsBitwiseTheFixtures) {
  const Checkpoint hub(hub_dir_);
  const moesq::model::DecoderModel a(*flat_), b(hub);
  for (int64_t s = 0; s < B_; ++s) {
    const std::vector<int32_t> row(ids_.begin() + s * T_, ids_.begin() + (s + 1) * T_);
    const std::vector<float> za = a.forward(row, a.default_forward_options());
    const std::vector<float> zb = b.forward(row, b.default_forward_options());
    ASSERT_EQ(za.size(), zb.size());
    EXPECT_EQ(std::memcmp(za.data(), zb.data(), za.size() * sizeof(float)), 0) << "sequence " << s;
  }
}

TEST_F(HubCase, EvalAndInspectMatchTheFixture) {
  const double nf = eval_nats(fixture()), nh = eval_nats(hub_dir_);
  std::printf("eval: per-expert fixture %.9f, hub layout %.9f nats/token\n", nf, nh);
  EXPECT_EQ(nf, nh);
  const moesq::test::CliRun ins = moesq("inspect '" + hub_dir_ + "' --json");
  ASSERT_EQ(ins.rc, 0) << ins.err;
  const json j = json::parse(ins.out);
  EXPECT_EQ(j["expert_projections"], j["expert_projections_expected"]);
  EXPECT_EQ(j["expert_projections"].get<int64_t>(), 4 * 16 * 3);
}

TEST_F(HubCase, CompressWritesTheStatedLayout) {
  const std::string out_flat = tmp_.file("out_flat"), out_hub = tmp_.file("out_hub");
  const std::string args = " --method sgptq --calib '" + ids_file_ + "' --calib-samples 2 --seq-len " +
                           std::to_string(T_) + " --json";
  const moesq::test::CliRun cf = moesq("compress '" + fixture() + "' --out '" + out_flat + "'" + args);
  ASSERT_EQ(cf.rc, 0) << cf.err;
  const moesq::test::CliRun ch = moesq("compress '" + hub_dir_ + "' --out '" + out_hub + "'" + args);
  ASSERT_EQ(ch.rc, 0) << ch.err;

  // config.json: the wrapper, quantization_config at the top, the text config inside without it.
  const json cfg = json::parse(moesq::test::slurp(std::filesystem::path(out_hub) / "config.json"));
  EXPECT_EQ(cfg["model_type"], "qwen3_5_moe");
  EXPECT_EQ(cfg["quantization_config"]["format"], "paired-4:8-nvfp4");
  EXPECT_FALSE(cfg["text_config"].contains("quantization_config"));
  EXPECT_EQ(cfg["text_config"]["model_type"], "qwen3_5_moe_text");
  EXPECT_TRUE(cfg.contains("vision_config"));

  // Tensors, by their stored names (SafetensorsFile on each shard, not the flat view).
  auto stored = [](const std::string& dir) {
    std::map<std::string, std::vector<uint8_t>> m;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() != ".safetensors") continue;
      moesq::io::SafetensorsFile f(e.path().string());
      for (const std::string& n : f.names()) {
        const moesq::io::TensorView& t = f.get(n);
        m[n].assign(t.data, t.data + t.nbytes);
      }
    }
    return m;
  };
  const auto src = stored(hub_dir_), dst = stored(out_hub), dst_flat = stored(out_flat);
  int64_t kept = 0, packed = 0;
  for (const auto& [n, bytes] : src) {
    if (n.find(".mlp.experts.gate_up_proj") != std::string::npos || n.find(".mlp.experts.down_proj") != std::string::npos) {
      EXPECT_FALSE(dst.count(n)) << n << ": the fused source tensor must not be in the per-expert output";
      continue;
    }
    ASSERT_TRUE(dst.count(n)) << n << " missing from the compressed output";
    EXPECT_TRUE(dst.at(n) == bytes) << n << " is not byte-identical to the source";
    ++kept;
  }
  EXPECT_EQ(kept, static_cast<int64_t>(src.size()) - 2 * 4);  // all but the 2 fused tensors of 4 layers
  for (const std::string& n : moesq::test::hub_extra_tensors()) EXPECT_TRUE(dst.count(n)) << n;
  for (const auto& [n, bytes] : dst) {
    const bool nested = n.rfind("model.language_model.", 0) == 0;
    const std::string flat_name = nested ? "model." + n.substr(21) : n;
    if (!moesq::io::is_expert_tensor(flat_name)) continue;
    ASSERT_TRUE(nested) << n << ": a routed expert written outside the text model's prefix";
    // The same projection of the flat compression: identical packed bytes (same calibration, same solver).
    ASSERT_TRUE(dst_flat.count(flat_name)) << flat_name;
    EXPECT_TRUE(dst_flat.at(flat_name) == bytes) << n << " differs from compressing the per-expert fixture";
    packed += n.size() > 14 && n.compare(n.size() - 14, 14, ".weight_packed") == 0;
  }
  EXPECT_EQ(packed, 4 * 16 * 3);

  // The output reads back (nested, per expert) and evaluates like the flat one.
  const double nh = eval_nats(out_hub), nf = eval_nats(out_flat), ns = eval_nats(fixture());
  std::printf("compressed sgptq: hub layout %.9f, per-expert %.9f nats/token (source %.9f)\n", nh, nf, ns);
  EXPECT_EQ(nh, nf);
  EXPECT_TRUE(std::isfinite(nh));
  EXPECT_NE(nh, ns) << "compression changed nothing";

  // `export --format compressed-tensors` keeps the nesting too: wrapper config with its
  // quantization_config at the top, per-expert tensors under the prefix, the ignore list in stored
  // module names (what a server matches against); it evaluates as the export of the flat output.
  const std::string ct_hub = tmp_.file("ct_hub"), ct_flat = tmp_.file("ct_flat");
  for (const auto& [from, to] : {std::pair{out_hub, ct_hub}, std::pair{out_flat, ct_flat}}) {
    const moesq::test::CliRun ex = moesq("export '" + from + "' --format compressed-tensors --out '" + to + "' --json");
    ASSERT_EQ(ex.rc, 0) << ex.err;
  }
  const json ccfg = json::parse(moesq::test::slurp(std::filesystem::path(ct_hub) / "config.json"));
  EXPECT_EQ(ccfg["model_type"], "qwen3_5_moe");
  EXPECT_EQ(ccfg["quantization_config"]["quant_method"], "compressed-tensors");
  EXPECT_FALSE(ccfg["text_config"].contains("quantization_config"));
  const std::vector<std::string> ignore = ccfg["quantization_config"]["ignore"].get<std::vector<std::string>>();
  const std::set<std::string> ig(ignore.begin(), ignore.end());
  for (const char* m : {"model.language_model.layers.0.mlp.gate", "model.language_model.layers.3.self_attn.q_proj",
                        "model.visual.patch_embed.proj", "lm_head"})
    EXPECT_TRUE(ig.count(m)) << m << " missing from the ignore list";
  EXPECT_TRUE(stored(ct_hub).count("model.language_model.layers.0.mlp.experts.0.gate_proj.weight_packed"));
  const double eh = eval_nats(ct_hub), ef = eval_nats(ct_flat);
  std::printf("compressed-tensors export: hub layout %.9f, per-expert %.9f nats/token\n", eh, ef);
  EXPECT_EQ(eh, ef);
}

TEST_F(HubCase, BadFusedShapeIsAClearCliError) {
  const std::string bad = tmp_.file("bad");
  std::filesystem::create_directory(bad);
  moesq::test::HubEdits ed;
  ed.extra_gate_up_rows = 1;
  moesq::test::write_hub_checkpoint(*flat_, bad, ed);
  const moesq::test::CliRun r = moesq("compress '" + bad + "' --method sgptq --out '" + tmp_.file("never") + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("model.language_model.layers.0.mlp.experts.gate_up_proj"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(tmp_.file("never"))) << "nothing half-written";
}

}  // namespace
