// `moesq export` between the two compressed-tensors storages of the paper's reference layout
// (tests/support/reference_layout.h: dense weight_packed and pair-bitmask, group 32, 0-d
// input_global_scale, one shard per layer) and sharded output (--max-shard-size: shards of at most
// that many bytes + model.safetensors.index.json, as hub checkpoints are), read back bit-exact.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "support/cli_run.h"
#include "support/reference_layout.h"
#include "support/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using moesq::test::run_moesq;
using moesq::test::slurp;

class CliExportShards : public ::testing::Test {
 protected:
  static inline moesq::test::TempDir* dir_ = nullptr;
  static inline int64_t layers_ = 0;

  static std::string file(const std::string& n) { return dir_->file(n); }
  static std::string must(const std::string& args) {
    const moesq::test::CliRun r = run_moesq(args, dir_->path.string());
    EXPECT_EQ(r.rc, 0) << args << "\n" << r.err;
    return r.out;
  }
  static double nats(const std::string& ckpt) {
    const std::string out = must("eval " + ckpt + " --data " + file("text.txt") + " --seq-len 64 --json");
    return out.empty() ? -1.0 : json::parse(out)["nats_per_token"].get<double>();
  }
  static void SetUpTestSuite() {
    dir_ = new moesq::test::TempDir("moesq_test_cli_export_shards");
    std::ofstream t(file("text.txt"));
    for (int i = 0; i < 200; ++i) t << "def f" << i << "(x):\n    return x * " << i << " + " << (i * 7) % 13 << "\n";
    t.close();
    must(std::string("compress ") + MOESQ_DEFAULT_MODEL + " --method magnitude --out " + file("mag") +
         " --calib-samples 2 --seq-len 16");
    layers_ = json::parse(std::ifstream(file("mag") + "/config.json"))["num_hidden_layers"].get<int64_t>();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
};

// The routed-expert tensors of `a` and `b` hold the same bytes (dtype and shape included), over
// whatever shards each uses; input_global_scale compared by value (0-d in the reference, [1] in ours).
void expect_same_expert_tensors(const std::string& a, const std::string& b) {
  const moesq::io::Checkpoint ca(a), cb(b);
  int compared = 0;
  for (const std::string& name : ca.names()) {
    if (name.find(".mlp.experts.") == std::string::npos) continue;
    ASSERT_TRUE(cb.has(name)) << name << " missing from " << b;
    const moesq::io::TensorView &x = ca.get(name), &y = cb.get(name);
    if (name.size() > 19 && name.compare(name.size() - 19, 19, ".input_global_scale") == 0) {
      EXPECT_EQ(moesq::io::to_f32(x), moesq::io::to_f32(y)) << name;
      continue;
    }
    EXPECT_EQ(x.dtype, y.dtype) << name;
    EXPECT_EQ(x.shape, y.shape) << name;
    EXPECT_TRUE(x.nbytes == y.nbytes && std::equal(x.data, x.data + x.nbytes, y.data)) << name << ": bytes differ";
    ++compared;
  }
  EXPECT_GT(compared, 0);
  EXPECT_EQ(ca.names().size(), cb.names().size()) << a << " vs " << b;
}

// Reference checkpoints in either storage convert into the other and back bit-exactly; the converted
// one evaluates to the same nats.
TEST_F(CliExportShards, ReferenceStoragesConvertIntoEachOtherBitExactly) {
  const std::string formats[2] = {"compressed-tensors", "moesq-pair-bitmask"};
  for (int i = 0; i < 2; ++i) {
    const std::string& f = formats[i];
    const std::string& other = formats[1 - i];
    const std::string x = file("x-" + f), ref = file("ref-" + f);
    must("export " + file("mag") + " --format " + f + " --out " + x);
    moesq::test::write_reference_layout(x, ref, layers_);
    const std::string a = file("a-" + f), b = file("b-" + f), c = file("c-" + f);
    must("export " + ref + " --format " + other + " --out " + a);  // reference f -> other storage
    must("export " + a + " --format " + f + " --out " + b);         // and back
    must("export " + b + " --format " + other + " --out " + c);     // and across again
    expect_same_expert_tensors(ref, b);
    expect_same_expert_tensors(a, c);
    const json qa = json::parse(std::ifstream(a + "/config.json"))["quantization_config"];
    EXPECT_EQ(qa.contains("paired48_sparse"), other == "moesq-pair-bitmask") << qa;
    EXPECT_EQ(qa["config_groups"]["group_0"]["weights"]["group_size"], 32) << qa;
    EXPECT_EQ(nats(a), nats(ref)) << f << " -> " << other;
  }
}

// --max-shard-size cuts the output into several shards with an index; every reader reads it back,
// and writing it out again as one file gives the same bytes as the unsharded export.
TEST_F(CliExportShards, ShardedExportReadsBackBitExact) {
  for (const std::string f : {"compressed-tensors", "moesq-pair-bitmask", "moesq"}) {
    const std::string one = file("one-" + f), sharded = file("sharded-" + f), back = file("back-" + f);
    must("export " + file("mag") + " --format " + f + " --out " + one);
    must("export " + file("mag") + " --format " + f + " --out " + sharded + " --max-shard-size 1MB");
    ASSERT_FALSE(fs::exists(sharded + "/model.safetensors")) << f;
    const json index = json::parse(std::ifstream(sharded + "/model.safetensors.index.json"));
    const moesq::io::Checkpoint ck(sharded);
    const std::vector<std::string> shards = ck.shard_files();
    EXPECT_GE(shards.size(), 3u) << f;
    uint64_t total = 0;
    for (const std::string& s : shards) {
      const moesq::io::SafetensorsFile sf(s);
      uint64_t data = 0;
      for (const std::string& n : sf.names()) data += sf.get(n).nbytes;
      total += data;
      // Greedy: a shard exceeds the limit only when it is one tensor larger than the limit.
      EXPECT_TRUE(data <= 1000000 || sf.names().size() == 1) << s << ": " << data << " bytes";
      EXPECT_EQ(fs::path(s).filename().string().rfind("model-0000", 0), 0u) << s;
    }
    EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total) << f;
    expect_same_expert_tensors(one, sharded);
    EXPECT_EQ(nats(sharded), nats(one)) << f;
    must("export " + sharded + " --format " + f + " --out " + back);
    EXPECT_TRUE(fs::exists(back + "/model.safetensors")) << "5GB default: one file for the tiny model";
    EXPECT_FALSE(fs::exists(back + "/model.safetensors.index.json"));
    EXPECT_TRUE(slurp(back + "/model.safetensors") == slurp(one + "/model.safetensors")) << f;
  }
}

TEST_F(CliExportShards, BadShardSizeIsRefusedNamingTheFlag) {
  for (const char* bad : {"5XB", "0", "GB", "1.5GB"}) {
    const moesq::test::CliRun r = run_moesq("export " + file("mag") + " --format compressed-tensors --out " +
                                                file(std::string("bad") + bad) + " --max-shard-size " + bad,
                                            dir_->path.string());
    EXPECT_NE(r.rc, 0) << bad;
    EXPECT_NE(r.err.find("--max-shard-size is \"" + std::string(bad) + "\""), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(file(std::string("bad") + bad))) << bad;
  }
}

}  // namespace
