// compressed-tensors configs read as they are meant (docs/FORMAT.md §10 "Config groups"): each routed
// expert projection takes the group whose `targets` cover its module (exact name, then "re:", then the
// class "Linear"), minus the `ignore` entries, and that group decides its weight group and its
// activations. Made from the tiny model's group-32 compressed-tensors export by rewriting config.json
// (and, for the per-module weight group, mixing the group-16 export's scales into layer 0).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using moesq::test::run_moesq;

json nvfp4_args(int group, bool dynamic) {
  json a = {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", group}, {"symmetric", true}};
  a["dynamic"] = dynamic ? json("local") : json(false);
  return a;
}
// One config group: weights at `wgroup`, activations at `agroup` (0: null, weight-only), dynamic
// "local" or static (dynamic false: the stored input_global_scale is γ_a).
json group(const json& targets, int wgroup, int agroup, bool static_act = false) {
  return {{"targets", targets},
          {"weights", nvfp4_args(wgroup, false)},
          {"input_activations", agroup ? nvfp4_args(agroup, !static_act) : json(nullptr)},
          {"output_activations", nullptr}};
}

// Rewrites DIR/model.safetensors with every input_global_scale set by `value(name)`.
template <class Value>
void set_input_global_scales(const std::string& dir, Value value) {
  const std::string path = dir + "/model.safetensors";
  moesq::io::SafetensorsWriter w;
  {
    const moesq::io::SafetensorsFile f(path);
    for (const std::string& n : f.names()) {
      const moesq::io::TensorView& t = f.get(n);
      if (n.size() > 19 && n.compare(n.size() - 19, 19, ".input_global_scale") == 0) {
        const float v = value(n);
        w.add(n, moesq::io::DType::F32, t.shape, &v, sizeof v);
      } else {
        w.add(n, t.dtype, t.shape, t.data, t.nbytes);
      }
    }
  }
  w.write(path);
}

class CliConfigGroups : public ::testing::Test {
 protected:
  static inline moesq::test::TempDir* dir_ = nullptr;
  static inline double w4a4_ = -1, w4a16_ = -1;  // nats of the group-32 export as exported / --act-quant none

  static std::string file(const std::string& n) { return dir_->file(n); }
  static std::string must(const std::string& args) {
    const moesq::test::CliRun r = run_moesq(args, dir_->path.string());
    EXPECT_EQ(r.rc, 0) << args << "\n" << r.err;
    return r.out;
  }
  static double nats(const std::string& ckpt, const std::string& extra = "") {
    const std::string out = must("eval " + ckpt + " --data " + file("text.txt") + " --seq-len 64 --json" + extra);
    return out.empty() ? -1.0 : json::parse(out)["nats_per_token"].get<double>();
  }
  static void SetUpTestSuite() {
    dir_ = new moesq::test::TempDir("moesq_test_cli_config_groups");
    std::ofstream t(file("text.txt"));
    for (int i = 0; i < 200; ++i) t << "def f" << i << "(x):\n    return x * " << i << " + " << (i * 7) % 13 << "\n";
    t.close();
    must(std::string("compress ") + MOESQ_DEFAULT_MODEL + " --method magnitude --out " + file("mag") +
         " --calib-samples 2 --seq-len 16");
    must("export " + file("mag") + " --format compressed-tensors --out " + file("x32"));
    must("export " + file("mag") + " --format compressed-tensors --scale-block 16 --out " + file("x16"));
    w4a4_ = nats(file("x32"));
    w4a16_ = nats(file("x32"), " --act-quant none");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // A copy of the group-32 export named `name` whose quantization_config gets `edit`.
  template <class Edit>
  std::string variant(const std::string& name, Edit edit) {
    const std::string out = file(name);
    fs::remove_all(out);
    fs::copy(file("x32"), out, fs::copy_options::recursive);
    json cfg = json::parse(std::ifstream(out + "/config.json"));
    edit(cfg["quantization_config"]);
    std::ofstream(out + "/config.json") << cfg.dump(2);
    return out;
  }
  std::string refused(const std::string& ckpt) {
    const moesq::test::CliRun r = run_moesq("eval " + ckpt + " --data " + file("text.txt") + " --seq-len 64",
                                            dir_->path.string());
    EXPECT_EQ(r.rc, 1) << ckpt << ": accepted\n" << r.out;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
    return r.err;
  }
  std::string first_expert_module(int proj_idx = 0) {
    const char* proj[] = {"gate_proj", "up_proj", "down_proj"};
    return std::string("model.layers.0.mlp.experts.0.") + proj[proj_idx];
  }
};

TEST_F(CliConfigGroups, FixtureRunsW4A4AndWeightOnlyDiffer) {
  ASSERT_GT(w4a4_, 0);
  ASSERT_GT(w4a16_, 0);
  EXPECT_NE(w4a4_, w4a16_) << "the cases below could not tell the two activation schemes apart";
}

// The experts' own group is weight-only; a later group targeting every Linear asks for W4A4. Before,
// the last group read decided for every module.
TEST_F(CliConfigGroups, ExpertsOwnGroupDecidesTheirActivations) {
  const std::string wo = variant("wo", [](json& q) {
    q["config_groups"] = {{"group_0", group({"re:.*mlp\\.experts\\..*"}, 32, 0)}, {"group_1", group({"Linear"}, 32, 32)}};
  });
  EXPECT_EQ(nats(wo), w4a16_);
  const json ins = json::parse(must("inspect " + wo + " --json"));
  EXPECT_EQ(ins["activations"], "none (weight-only)");
  // And the other way round: a regex group for the experts asks for W4A4, the Linear group is weight-only.
  const std::string a4 = variant("a4", [](json& q) {
    q["config_groups"] = {{"group_0", group({"Linear"}, 32, 0)}, {"group_1", group({"re:.*mlp\\.experts\\..*"}, 32, 32)}};
  });
  EXPECT_EQ(nats(a4), w4a4_);
}

// An exact module name wins over a "re:" pattern, which wins over a class name.
TEST_F(CliConfigGroups, ExactNameBeatsRegexBeatsClass) {
  const json cfg = json::parse(std::ifstream(file("x32") + "/config.json"));
  const int64_t L = cfg["num_hidden_layers"].get<int64_t>();
  const int64_t E = cfg.contains("num_experts") ? cfg["num_experts"].get<int64_t>() : cfg["num_local_experts"].get<int64_t>();
  json names = json::array();
  for (int64_t l = 0; l < L; ++l)
    for (int64_t e = 0; e < E; ++e)
      for (const char* p : {"gate_proj", "up_proj", "down_proj"})
        names.push_back("model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + "." + p);
  const std::string exact = variant("exact", [&](json& q) {
    q["config_groups"] = {{"group_0", group({"re:.*experts.*"}, 32, 0)}, {"group_1", group(names, 32, 32)}};
  });
  EXPECT_EQ(nats(exact), w4a4_);
  const std::string regex = variant("regex", [&](json& q) {
    q["config_groups"] = {{"group_0", group({"Linear"}, 32, 32)}, {"group_1", group({"re:model\\.layers"}, 32, 0)}};
  });
  EXPECT_EQ(nats(regex), w4a16_) << "re: is anchored at the start only (Python re.match)";
}

// Each module's group decides its weight group: layer 0's experts stored at group 16, the rest at 32.
TEST_F(CliConfigGroups, WeightGroupPerModule) {
  const std::string mixed = variant("mixed", [](json& q) {
    q["config_groups"] = {{"group_0", group({"re:model\\.layers\\.0\\.mlp\\.experts\\."}, 16, 32)},
                          {"group_1", group({"Linear"}, 32, 32)}};
  });
  const moesq::io::SafetensorsFile x32(file("x32") + "/model.safetensors"), x16(file("x16") + "/model.safetensors");
  moesq::io::SafetensorsWriter w;
  for (const std::string& name : x32.names()) {
    const bool layer0_scale = name.rfind("model.layers.0.mlp.experts.", 0) == 0 &&
                              name.size() > 13 && name.compare(name.size() - 13, 13, ".weight_scale") == 0;
    const moesq::io::TensorView& t = layer0_scale ? x16.get(name) : x32.get(name);
    w.add(name, t.dtype, t.shape, t.data, t.nbytes);
  }
  w.write(mixed + "/model.safetensors");
  EXPECT_EQ(nats(mixed), w4a4_);
  // The same tensors read with one group-32 group: layer 0's [N, K/16] scales are refused by name.
  fs::copy_file(mixed + "/model.safetensors", file("x32-shape") + ".safetensors");
  const std::string one = variant("one", [](json&) {});
  fs::copy_file(file("x32-shape") + ".safetensors", one + "/model.safetensors", fs::copy_options::overwrite_existing);
  const std::string err = refused(one);
  EXPECT_NE(err.find("model.layers.0.mlp.experts."), std::string::npos) << err;
  EXPECT_NE(err.find("weight_scale"), std::string::npos) << err;
}

TEST_F(CliConfigGroups, PackedModulesOutsideEveryGroupAreRefusedNamingThem) {
  const std::string ign = variant("ign", [](json& q) { q["ignore"] = {"lm_head", "re:.*mlp\\.experts\\.1\\."}; });
  std::string err = refused(ign);
  EXPECT_NE(err.find("ignore entry \"re:.*mlp\\.experts\\.1\\.\" excludes it"), std::string::npos) << err;
  EXPECT_NE(err.find("module model.layers.0.mlp.experts.1."), std::string::npos) << err;
  const std::string none = variant("none", [](json& q) {
    q["config_groups"] = {{"group_0", group({"re:.*self_attn.*"}, 32, 32)}};
  });
  err = refused(none);
  EXPECT_NE(err.find("no config_groups entry targets it"), std::string::npos) << err;
  const std::string bad = variant("badre", [](json& q) { q["ignore"] = {"re:(unclosed"}; });
  err = refused(bad);
  EXPECT_NE(err.find("re:(unclosed"), std::string::npos) << err;
  const std::string notargets = variant("notargets", [](json& q) { q["config_groups"]["group_0"].erase("targets"); });
  err = refused(notargets);
  EXPECT_NE(err.find("config_groups.group_0.targets is missing"), std::string::npos) << err;
}

TEST_F(CliConfigGroups, RoutedExpertsWithDifferentActivationsAreRefusedNamingBoth) {
  const std::string two = variant("two", [](json& q) {
    q["config_groups"] = {{"group_0", group({"re:model\\.layers\\.0\\.mlp\\.experts\\."}, 32, 0)},
                          {"group_1", group({"Linear"}, 32, 32)}};
  });
  const std::string err = refused(two);
  EXPECT_NE(err.find("config_groups.group_0.input_activations: null (weight-only)"), std::string::npos) << err;
  EXPECT_NE(err.find("config_groups.group_1.input_activations: NVFP4 group 32"), std::string::npos) << err;
  EXPECT_NE(err.find("one activation scheme for all routed experts"), std::string::npos) << err;
}

// Ignored routed experts stored as bf16 .weight load as dense in a weight-only checkpoint; beside W4A4
// experts they are refused (their activations would not be quantized).
TEST_F(CliConfigGroups, IgnoredDenseExpertsLoadWhenTheSchemesAgree) {
  auto with_dense_layer0 = [&](const std::string& name, int agroup) {
    const std::string out = variant(name, [&](json& q) {
      q["config_groups"] = {{"group_0", group({"Linear"}, 32, agroup)}};
      q["ignore"] = {"lm_head", "re:model\\.layers\\.0\\.mlp\\.experts\\."};
    });
    const moesq::io::SafetensorsFile x32(file("x32") + "/model.safetensors");
    // The original model's layer-0 experts (its one file or its shards).
    moesq::io::SafetensorsWriter w;
    for (const std::string& n : x32.names())
      if (n.rfind("model.layers.0.mlp.experts.", 0) != 0) w.add(n, x32.get(n).dtype, x32.get(n).shape, x32.get(n).data, x32.get(n).nbytes);
    for (const auto& e : fs::directory_iterator(MOESQ_DEFAULT_MODEL)) {
      if (e.path().extension() != ".safetensors") continue;
      const moesq::io::SafetensorsFile src(e.path().string());
      for (const std::string& n : src.names())
        if (n.rfind("model.layers.0.mlp.experts.", 0) == 0) w.add(n, src.get(n).dtype, src.get(n).shape, src.get(n).data, src.get(n).nbytes);
    }
    w.write(out + "/model.safetensors");
    return out;
  };
  const std::string wo = with_dense_layer0("dense0-wo", 0);
  EXPECT_GT(nats(wo), 0);
  const std::string err = refused(with_dense_layer0("dense0-a4", 32));
  EXPECT_NE(err.find("unquantized (ignored or untargeted)"), std::string::npos) << err;
}

// input_activations.dynamic false: each projection's stored input_global_scale is its γ_a (the
// exact rule is tests/model/test_static_act_scale.cpp); gate and up must agree; static and dynamic
// routed experts are not mixed.
TEST_F(CliConfigGroups, StaticInputGlobalScaleIsTheActivationScale) {
  auto static_ckpt = [&](const std::string& name) {
    return variant(name, [](json& q) { q["config_groups"] = {{"group_0", group({"Linear"}, 32, 32, true)}}; });
  };
  const std::string one = static_ckpt("static-1");  // the export's default input_global_scale 1.0
  const double nats_one = nats(one);
  EXPECT_GT(nats_one, 0);
  EXPECT_NE(nats_one, w4a4_) << "a static γ_a = 1 quantized like the per-token one";
  EXPECT_EQ(json::parse(must("inspect " + one + " --json"))["activations"], "nvfp4 block 32, static input_global_scale");
  const std::string other = static_ckpt("static-0.3");
  set_input_global_scales(other, [](const std::string&) { return 0.3f; });
  EXPECT_NE(nats(other), nats_one) << "the stored input_global_scale was not used";
  const std::string gu = static_ckpt("static-gu");
  const std::string victim = "model.layers.1.mlp.experts.3.up_proj.input_global_scale";
  set_input_global_scales(gu, [&](const std::string& n) { return n == victim ? 2.0f : 1.0f; });
  std::string err = refused(gu);
  EXPECT_NE(err.find("model.layers.1.mlp.experts.3.gate_proj.input_global_scale (1) and " + victim + " (2) differ"),
            std::string::npos)
      << err;
  const std::string mixed = variant("static-mixed", [](json& q) {
    q["config_groups"] = {{"group_0", group({"re:model\\.layers\\.0\\.mlp\\.experts\\."}, 32, 32, true)},
                          {"group_1", group({"Linear"}, 32, 32)}};
  });
  err = refused(mixed);
  EXPECT_NE(err.find("NVFP4 group 32, static input_global_scale"), std::string::npos) << err;
  EXPECT_NE(err.find("NVFP4 group 32, dynamic"), std::string::npos) << err;
}

}  // namespace
