// io/export_checkpoint.h + io/import_checkpoint.h on the tiny fixture: a paired 4:8 (and a dense
// NVFP4) moesq checkpoint exported to compressed-tensors and pair-bitmask, read back through
// read_packed_weight: identical packed bits (canonical form), the tensors and dtypes the formats
// name, the config (ignore list, marker), INT4 pack-quantized import, and errors naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>

#include "core/error.h"
#include "core/half.h"
#include "format/nvfp4.h"
#include "io/compressed_checkpoint.h"
#include "io/export_checkpoint.h"
#include "io/export_layouts.h"
#include "io/import_checkpoint.h"
#include "support/int4_checkpoint.h"
#include "support/packed_checkpoint.h"
#include "support/packed_weight_eq.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

namespace {

using namespace moesq;
using namespace moesq::io;
using nlohmann::json;

const std::string kModel = MOESQ_DEFAULT_MODEL;

std::map<std::string, format::PackedWeight> pack_all(const Checkpoint& src, bool sparse) {
  return test::pack_all_experts(src, sparse);
}

std::string write_moesq(const Checkpoint& src, const std::map<std::string, format::PackedWeight>& packed, bool sparse,
                        const fs::path& dir) {
  return test::write_moesq_checkpoint(src, packed, sparse, dir);
}

using moesq::test::expect_same_bits;

class ExportCheckpoint : public ::testing::Test {
 protected:
  test::TempDir tmp_{"moesq_test_export"};
  Checkpoint src_{kModel};
};

TEST_F(ExportCheckpoint, PairedExportsReadBackWithIdenticalBits) {
  const auto packed = pack_all(src_, true);
  const std::string moesq_dir = write_moesq(src_, packed, true, tmp_.path / "src");
  // Each layout from the moesq checkpoint, then back to moesq from a compressed-tensors import.
  const std::pair<ExportFormat, std::string> runs[] = {{ExportFormat::CompressedTensors, moesq_dir},
                                                       {ExportFormat::PairBitmask, moesq_dir},
                                                       {ExportFormat::Moesq, (tmp_.path / "compressed-tensors").string()}};
  for (const auto& [f, from] : runs) {
    const std::string out = (tmp_.path / export_format_name(f)).string();
    const json s = export_checkpoint(from, f, out);
    EXPECT_EQ(s["paired48_projections"], s["projections"]);
    const Checkpoint ck(out);
    const QuantizationConfig q = read_quantization_config(ck);
    int64_t zero_pair_chunks = 0;
    for (const auto& [prefix, p] : packed) {
      const int64_t N = p.N(), K = p.K();
      if (f == ExportFormat::CompressedTensors) {
        EXPECT_EQ(ck.get(prefix + kWeightPacked).dtype, DType::U8);
        EXPECT_EQ(ck.get(prefix + kWeightPacked).shape, (std::vector<int64_t>{N, K / 2}));
        EXPECT_FALSE(ck.has(prefix + kWeightMeta));
      }
      if (f == ExportFormat::PairBitmask) {
        EXPECT_EQ(ck.get(prefix + kWeightSparsePacked).shape, (std::vector<int64_t>{N, K / 4}));
        EXPECT_EQ(ck.get(prefix + kWeightSparseMask).shape, (std::vector<int64_t>{N, K / 16}));
        EXPECT_FALSE(ck.has(prefix + kWeightPacked));
      }
      if (f != ExportFormat::Moesq) {
        EXPECT_EQ(ck.get(prefix + kWeightScale).dtype, DType::F8_E4M3);
        // Group 32 by default for paired 4:8 (the reference's layout, one UE4M3 scale per 32 weights).
        EXPECT_EQ(ck.get(prefix + kWeightScale).shape, (std::vector<int64_t>{N, K / 32}));
        EXPECT_EQ(ck.get_f32(prefix + kInputGlobalScale, {1})[0], 1.0f);
      }
      int64_t changed = 0;
      const format::PackedWeight want = canonical_sparse48(*p.sparse48(), &changed);
      zero_pair_chunks += changed;
      expect_same_bits(read_packed_weight(ck, q, prefix, N, K), want, prefix);
    }
    std::printf("%s: %lld chunks with an all-zero kept pair (canonicalized)\n", export_format_name(f),
                static_cast<long long>(zero_pair_chunks));
  }
}

TEST_F(ExportCheckpoint, CompressedTensorsConfigNamesEveryUncompressedModule) {
  const std::string moesq_dir = write_moesq(src_, pack_all(src_, true), true, tmp_.path / "moesq");
  for (bool pb : {false, true}) {
    const std::string out = (tmp_.path / (pb ? "pb" : "ct")).string();
    export_checkpoint(moesq_dir, pb ? ExportFormat::PairBitmask : ExportFormat::CompressedTensors, out);
    std::ifstream f(out + "/config.json");
    const json qc = json::parse(f)["quantization_config"];
    EXPECT_EQ(qc["quant_method"], "compressed-tensors");
    EXPECT_EQ(qc["format"], "nvfp4-pack-quantized");
    const json& g = qc["config_groups"]["group_0"];
    for (const char* k : {"weights", "input_activations"}) {
      EXPECT_EQ(g[k]["type"], "float");
      EXPECT_EQ(g[k]["num_bits"], 4);
      EXPECT_EQ(g[k]["strategy"], "tensor_group");
      EXPECT_EQ(g[k]["group_size"], 32);  // paired 4:8 source: the reference's group
      EXPECT_EQ(g[k]["symmetric"], true);
    }
    EXPECT_EQ(g["input_activations"]["dynamic"], "local");
    const auto ignore = qc["ignore"].get<std::vector<std::string>>();
    auto has = [&](const std::string& m) { return std::find(ignore.begin(), ignore.end(), m) != ignore.end(); };
    for (const char* m : {"lm_head", "model.embed_tokens", "model.norm", "model.layers.0.mlp.gate",
                          "model.layers.3.self_attn.q_proj", "model.layers.3.self_attn.o_proj",
                          "model.layers.1.input_layernorm", "model.layers.1.self_attn.k_norm"})
      EXPECT_TRUE(has(m)) << m;
    for (const std::string& m : ignore) EXPECT_EQ(m.find(".mlp.experts."), std::string::npos) << m;
    EXPECT_EQ(qc.contains("paired48_sparse"), pb);
    if (pb) EXPECT_EQ(qc["paired48_sparse"], (json{{"layout", "pair-bitmask"}, {"version", 1}}));
    EXPECT_TRUE(fs::exists(out + "/export.json"));
  }
}

TEST_F(ExportCheckpoint, DenseNvfp4ExportsToCompressedTensorsOnly) {
  const auto packed = pack_all(src_, false);
  const std::string moesq_dir = write_moesq(src_, packed, false, tmp_.path / "moesq");
  const std::string out = (tmp_.path / "ct").string();
  export_checkpoint(moesq_dir, ExportFormat::CompressedTensors, out);
  const Checkpoint ck(out);
  const QuantizationConfig q = read_quantization_config(ck);
  for (const auto& [prefix, p] : packed) expect_same_bits(read_packed_weight(ck, q, prefix, p.N(), p.K()), p, prefix);
  try {
    export_checkpoint(moesq_dir, ExportFormat::PairBitmask, (tmp_.path / "pb").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not paired 4:8"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp_.path / "pb"));
}

TEST_F(ExportCheckpoint, Int4PackQuantizedDequantizesToBf16Products) {
  const fs::path dir = tmp_.path / "int4";
  const std::map<std::string, std::vector<float>> want = test::write_int4_checkpoint(src_, dir.string(), 32);
  const ModelSpec& s = src_.spec();
  const Checkpoint ck(dir.string());
  const QuantizationConfig q = read_quantization_config(ck);
  EXPECT_EQ(q.storage, ExpertStorage::Int4);
  EXPECT_FALSE(q.act_quant);
  ASSERT_EQ(want.size(), static_cast<size_t>(s.num_layers * s.num_experts * 3));
  for (const auto& [prefix, ref] : want) {
    const bool down = prefix.ends_with("down_proj");
    const int64_t N = down ? s.hidden_size : s.moe_intermediate_size, K = down ? s.moe_intermediate_size : s.hidden_size;
    ExpertStorage st = ExpertStorage::Dense;
    const std::vector<float> got = read_expert_weight_f32(ck, q, prefix, N, K, &st);
    EXPECT_EQ(st, ExpertStorage::Int4);
    ASSERT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << prefix;
  }
}

// A bf16 scale code that is NaN, or finite but so large that a code of magnitude 7 overflows bf16, is
// refused naming the scale tensor (both reached the dequantized weights before; fuzz_compressed).
TEST_F(ExportCheckpoint, Int4ScaleThatIsNanOrOverflowsIsRefusedNamingTheTensor) {
  const ModelSpec& s = src_.spec();
  const std::string bad = expert_tensor_prefix(s, 0, 1, ExpertProj::Up);
  for (uint16_t code : {uint16_t{0x7fc0}, uint16_t{0x7f7f}}) {  // NaN; 3.39e38 (the largest finite bf16)
    const fs::path dir = tmp_.path / ("int4-" + std::to_string(code));
    test::write_int4_checkpoint(src_, dir.string(), 32, [&](const std::string& prefix, std::vector<uint16_t>& scale) {
      if (prefix == bad) scale[3] = code;
    });
    const Checkpoint ck(dir.string());
    const QuantizationConfig q = read_quantization_config(ck);
    (void)read_expert_weight_f32(ck, q, expert_tensor_prefix(s, 0, 1, ExpertProj::Gate), s.moe_intermediate_size,
                                 s.hidden_size);  // an untouched projection still reads
    try {
      read_expert_weight_f32(ck, q, bad, s.moe_intermediate_size, s.hidden_size);
      FAIL() << "scale code 0x" << std::hex << code << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad + kWeightScale), std::string::npos) << e.what();
    }
  }
}

std::string error_of(const json& qc) {
  try {
    read_compressed_tensors_config(qc, "X/config.json quantization_config");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ImportConfig, UnsupportedSchemesNameTheFieldAndValue) {
  const json nvfp4 = {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 16}, {"symmetric", true}};
  json base = {{"quant_method", "compressed-tensors"},
               {"format", "nvfp4-pack-quantized"},
               {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", nvfp4}, {"input_activations", nvfp4}}}}}};
  base["config_groups"]["group_0"]["input_activations"]["dynamic"] = "local";
  EXPECT_EQ(error_of(base), "");
  json fp8 = base;
  fp8["format"] = "float-quantized";
  EXPECT_NE(error_of(fp8).find("format \"float-quantized\""), std::string::npos) << error_of(fp8);
  json a8 = base;
  a8["config_groups"]["group_0"]["input_activations"]["num_bits"] = 8;
  EXPECT_NE(error_of(a8).find("config_groups.group_0.input_activations.num_bits is 8"), std::string::npos)
      << error_of(a8);
  json w8 = base;
  w8["config_groups"]["group_0"]["weights"]["group_size"] = 64;
  EXPECT_NE(error_of(w8).find("weights.group_size is 64"), std::string::npos) << error_of(w8);
  json gs32 = base;  // the reference's layout: weights and activations at group 32
  gs32["config_groups"]["group_0"]["weights"]["group_size"] = 32;
  gs32["config_groups"]["group_0"]["input_activations"]["group_size"] = 32;
  EXPECT_EQ(error_of(gs32), "");
  json two = gs32;  // two groups with different weight groups: each module reads its own group's
  two["config_groups"]["group_1"] = base["config_groups"]["group_0"];
  EXPECT_EQ(error_of(two), "");
  json untargeted = base;  // a group must say which modules it covers
  untargeted["config_groups"]["group_0"].erase("targets");
  EXPECT_NE(error_of(untargeted).find("config_groups.group_0.targets is missing"), std::string::npos)
      << error_of(untargeted);
  json static_act = base;  // a static activation global scale: the stored input_global_scale
  static_act["config_groups"]["group_0"]["input_activations"]["dynamic"] = false;
  EXPECT_EQ(error_of(static_act), "");
  json odd_dynamic = base;
  odd_dynamic["config_groups"]["group_0"]["input_activations"]["dynamic"] = "global";
  EXPECT_NE(error_of(odd_dynamic).find("config_groups.group_0.input_activations.dynamic is \"global\""),
            std::string::npos)
      << error_of(odd_dynamic);
  json pb = base;
  pb["paired48_sparse"] = {{"layout", "pair-bitmask"}, {"version", 2}};
  EXPECT_NE(error_of(pb).find("paired48_sparse.version is 2"), std::string::npos) << error_of(pb);
  json kv = base;
  kv["kv_cache_scheme"] = {{"num_bits", 8}};
  EXPECT_NE(error_of(kv).find("kv_cache_scheme"), std::string::npos) << error_of(kv);
  json w4a16 = base;
  w4a16["config_groups"]["group_0"]["input_activations"] = nullptr;
  EXPECT_EQ(error_of(w4a16), "");
}

TEST_F(ExportCheckpoint, ForeignQuantMethodIsRefusedNamingIt) {
  const fs::path dir = tmp_.path / "fp8";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kModel)) fs::copy_file(e.path(), dir / e.path().filename());
  json cfg = src_.config();
  cfg["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}};
  std::ofstream(dir / "config.json") << cfg.dump(2);
  try {
    read_quantization_config(Checkpoint(dir.string()));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quant_method \"fp8\" is not supported"), std::string::npos) << e.what();
  }
}

}  // namespace
