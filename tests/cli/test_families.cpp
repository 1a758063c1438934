// End-to-end CLI runs on the non-Qwen3 family fixtures (tests/fixtures/families: qwen2_moe with a shared
// expert + gate and a dense layer, mixtral with w1/w2/w3 names, olmoe, deepseek_v3, gpt_oss with fused
// biased experts written back per expert): `inspect`, `eval` against transformers' cross-entropy,
// greedy `generate` against the full forward's argmax, `compress --method sgptq` and `--method moesq
// --epochs 1`, and the compressed round trip. The contract checked: compression replaces ROUTED-expert projections only —
// routers, shared experts and their gates, dense MLP layers, attention, norms and embeddings come out
// byte-identical to the source, and report.json / inspect list them as not compressed.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"
#include "model/decoder.h"
#include "support/npy.h"
#include "support/temp_dir.h"

namespace {

using nlohmann::json;

// `moesq eval`'s bar against summary.json's "ce".
constexpr double kCeAtol = 1e-4;
// A compressed random-weight fixture evaluates close to its source: measured |Δ nats| ≤ 7e-4 on all
// three and both methods (W4A4, 2 × 64 calibration tokens). These untrained models sit near the
// uniform ln 256 = 5.545, so this bound checks that the output loads and runs, not quality.
constexpr double kCompressedNatsAtol = 0.05;

struct CmdResult {
  int code = -1;
  std::string out, err;
};

CmdResult run(const moesq::test::TempDir& dir, const std::string& args) {
  const std::string o = dir.file("stdout"), e = dir.file("stderr");
  const std::string cmd = std::string("MOESQ_QUIET=1 ") + MOESQ_BINARY + " " + args + " >" + o + " 2>" + e;
  const int st = std::system(cmd.c_str());
  CmdResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream fo(o), fe(e);
  r.out.assign(std::istreambuf_iterator<char>(fo), {});
  r.err.assign(std::istreambuf_iterator<char>(fe), {});
  return r;
}

std::string fixture(const std::string& name) { return std::string(MOESQ_FIXTURES) + "/families/" + name; }

// The reference's input_ids [B, T] as one 1-D int32 .npy (numpy format v1); eval with --seq-len T
// then sees exactly the B reference sequences as its windows.
std::string write_reference_ids(const moesq::test::TempDir& dir, const std::string& arch, int64_t* T) {
  moesq::io::SafetensorsFile f(fixture("tiny-" + arch + "-reference") + "/reference.safetensors");
  const moesq::io::TensorView& ids = f.get("input_ids");
  *T = ids.shape.at(1);
  const std::vector<float> idf = moesq::io::to_f32(ids);  // [B, T] token ids, exact in fp32
  return dir.write("ids.npy", moesq::test::npy_int32(std::vector<int32_t>(idf.begin(), idf.end())));
}

double reference_ce(const std::string& arch) {
  std::ifstream js(fixture("tiny-" + arch + "-reference") + "/summary.json");
  return json::parse(js).at("ce").get<double>();
}

class CliFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(CliFamilies, EvalMatchesTransformersCrossEntropy) {
  const std::string arch = GetParam();
  moesq::test::TempDir dir("moesq_fam_eval");
  int64_t T = 0;
  const std::string ids = write_reference_ids(dir, arch, &T);
  const CmdResult r = run(dir, "eval " + fixture("tiny-" + arch) + " --data " + ids + " --seq-len " +
                                   std::to_string(T) + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["predicted_tokens"].get<int64_t>(), 2 * (T - 1));
  const double nats = j["nats_per_token"].get<double>();
  std::printf("%s: moesq eval %.7f nats/token, transformers %.7f\n", arch.c_str(), nats, reference_ce(arch));
  EXPECT_NEAR(nats, reference_ce(arch), kCeAtol) << arch;
}

TEST_P(CliFamilies, InspectListsWhatIsNotCompressed) {
  const std::string arch = GetParam();
  moesq::test::TempDir dir("moesq_fam_inspect");
  const CmdResult r = run(dir, "inspect " + fixture("tiny-" + arch) + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["expert_projections"], j["expert_projections_expected"]) << arch << ": routed experts not all found";
  EXPECT_EQ(j.value("other_expert_tensors", 0), 0) << arch;
  const json& nc = j["not_compressed"];
  const int64_t moe_layers = j["moe_layers"].get<int64_t>();
  EXPECT_EQ(nc["router"].get<int64_t>(), moe_layers);
  EXPECT_EQ(j.contains("mla"), arch == "deepseek-v3") << arch;
  if (arch == "qwen2-moe") {  // one gated shared expert per MoE layer, layer 1 dense (mlp_only_layers)
    EXPECT_EQ(nc["shared_expert"].get<int64_t>(), 3 * moe_layers);
    EXPECT_EQ(nc["shared_expert_gate"].get<int64_t>(), moe_layers);
    EXPECT_EQ(nc["dense_mlp_layers"], json::array({1}));
    EXPECT_EQ(nc["dense_mlp"].get<int64_t>(), 3);
  } else if (arch == "deepseek-v3") {  // ungated shared experts, e_score_correction_bias, layer 0 dense
    EXPECT_EQ(nc["shared_expert"].get<int64_t>(), 3 * moe_layers);
    EXPECT_EQ(nc["shared_expert_gate"].get<int64_t>(), 0);
    EXPECT_EQ(nc["router_bias"].get<int64_t>(), moe_layers);
    EXPECT_EQ(nc["dense_mlp_layers"], json::array({0}));  // first_k_dense_replace = 1
    // Multi-head latent attention named with its dims; the latent cache row is (kv_lora + rope) bf16.
    EXPECT_EQ(j["mla"]["kv_lora_rank"].get<int64_t>(), 32);
    EXPECT_EQ(j["mla"]["qk_rope_head_dim"].get<int64_t>(), 16);
    EXPECT_EQ(j["mla"]["kv_cache_bytes_per_token_per_layer"].get<int64_t>(), 2 * (32 + 16));
    EXPECT_EQ(nc["dense_mlp"].get<int64_t>(), 3);
  } else if (arch == "gpt-oss") {  // router logit bias; fused experts' gate_up / down biases, kept as stored
    EXPECT_EQ(nc["router_bias"].get<int64_t>(), moe_layers);
    EXPECT_EQ(nc["expert_bias"].get<int64_t>(), 2 * moe_layers);
    EXPECT_EQ(nc["shared_expert"].get<int64_t>(), 0);
    EXPECT_TRUE(nc["dense_mlp_layers"].empty());
  } else {
    EXPECT_EQ(nc["shared_expert"].get<int64_t>(), 0);
    EXPECT_EQ(nc["expert_bias"].get<int64_t>(), 0);
    EXPECT_TRUE(nc["dense_mlp_layers"].empty());
  }
}

// Compress with both methods, then: every non-routed tensor byte-identical, routed ones all packed,
// the output loads (W4A4 by default) and evaluates near the source.
TEST_P(CliFamilies, CompressKeepsNonRoutedTensorsAndRoundTrips) {
  const std::string arch = GetParam();
  const std::string src_dir = fixture("tiny-" + arch);
  moesq::test::TempDir dir("moesq_fam_compress");
  int64_t T = 0;
  const std::string ids = write_reference_ids(dir, arch, &T);
  const CmdResult base = run(dir, "eval " + src_dir + " --data " + ids + " --seq-len " + std::to_string(T) + " --json");
  ASSERT_EQ(base.code, 0) << base.err;
  const double src_nats = json::parse(base.out)["nats_per_token"].get<double>();
  const moesq::io::Checkpoint src(src_dir);
  for (const std::string method : {"sgptq", "moesq --epochs 1"}) {
    const std::string out = dir.file("out_" + method.substr(0, 5));
    const CmdResult r = run(dir, "compress " + src_dir + " --method " + method + " --out " + out + " --calib " + ids +
                                     " --calib-samples 2 --seq-len " + std::to_string(T) + " --json");
    ASSERT_EQ(r.code, 0) << arch << " " << method << ": " << r.err;
    const moesq::io::Checkpoint dst(out);
    std::set<std::string> kept_src, kept_dst;
    int64_t packed = 0;
    for (const std::string& n : src.names())
      if (!moesq::io::is_expert_tensor(n)) kept_src.insert(n);
    for (const std::string& n : dst.names()) {
      if (moesq::io::is_expert_tensor(n)) {
        packed += n.size() > 14 && n.compare(n.size() - 14, 14, ".weight_packed") == 0;
        continue;
      }
      kept_dst.insert(n);
    }
    EXPECT_EQ(kept_src, kept_dst) << arch << " " << method << ": non-routed tensor set changed";
    if (arch == "gpt-oss")  // the byte-identical check below covers the biases and the biased router
      for (const char* rest : {"mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj_bias", "mlp.router.bias",
                               "mlp.router.weight"})
        EXPECT_TRUE(kept_src.count(moesq::io::layer_tensor(1, rest))) << rest;
    for (const std::string& n : kept_src) {
      if (!dst.has(n)) continue;
      const moesq::io::TensorView &a = src.get(n), &b = dst.get(n);
      EXPECT_TRUE(a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes &&
                  std::memcmp(a.data, b.data, a.nbytes) == 0)
          << arch << " " << method << ": " << n << " is not byte-identical to the source";
    }
    const json ins = json::parse(run(dir, "inspect " + out + " --json").out);
    EXPECT_EQ(packed, ins["expert_projections_expected"].get<int64_t>()) << arch << ": not every routed projection packed";
    std::ifstream rf(out + "/report.json");
    const json rep = json::parse(rf);
    EXPECT_EQ(rep["not_compressed"], ins["not_compressed"]) << arch << ": report and inspect disagree";
    if (method == "sgptq") {  // the compressed-tensors export's ignore list never covers a compressed projection
      const std::string ct = dir.file("ct_" + arch);
      const CmdResult x = run(dir, "export " + out + " --format compressed-tensors --out " + ct);
      ASSERT_EQ(x.code, 0) << arch << ": " << x.err;
      std::ifstream cf(ct + "/config.json");
      const json ignore = json::parse(cf)["quantization_config"]["ignore"];
      const moesq::io::Checkpoint exported(ct);
      int64_t projections = 0;
      std::set<std::string> covering;  // ignore entries that are a module of (or above) a compressed tensor
      for (const std::string& n : exported.names()) {
        if (!moesq::io::is_expert_tensor(n)) continue;
        ++projections;
        for (const auto& m : ignore)
          if (exported.stored_name(n).rfind(m.get<std::string>() + ".", 0) == 0) covering.insert(m.get<std::string>());
      }
      EXPECT_GT(projections, 0) << arch;
      EXPECT_TRUE(covering.empty()) << arch << ": ignore covers compressed tensors under " << *covering.begin();
      if (arch == "gpt-oss") {  // the biased router stays ignored; the expert block with its biases does not
        for (const char* m : {"model.layers.1.mlp.router", "model.layers.1.mlp.experts"})
          EXPECT_EQ(std::count(ignore.begin(), ignore.end(), json(m)), m == std::string("model.layers.1.mlp.router"))
              << m;
        // The fused biases are written per expert Linear (llm-compressor's layout): gate = even, up = odd
        // columns of gate_up_proj_bias, down = its row; same bytes; the fused tensors are gone.
        const moesq::io::ModelSpec& sp = src.spec();
        const int64_t I = sp.moe_intermediate_size, H = sp.hidden_size;
        const moesq::io::TensorView &gu = src.get(moesq::io::layer_tensor(1, "mlp.experts.gate_up_proj_bias")),
                                    &dn = src.get(moesq::io::layer_tensor(1, "mlp.experts.down_proj_bias"));
        EXPECT_FALSE(exported.has(moesq::io::layer_tensor(1, "mlp.experts.gate_up_proj_bias")));
        EXPECT_FALSE(exported.has(moesq::io::layer_tensor(1, "mlp.experts.down_proj_bias")));
        const size_t es = moesq::io::dtype_size(gu.dtype);
        for (int64_t e = 0; e < sp.num_experts; ++e) {
          const std::string p = moesq::io::layer_tensor(1, "mlp.experts." + std::to_string(e) + ".");
          const moesq::io::TensorView &g = exported.get(p + "gate_proj.bias"), &u = exported.get(p + "up_proj.bias"),
                                      &d = exported.get(p + "down_proj.bias");
          ASSERT_TRUE(g.shape == std::vector<int64_t>{I} && u.shape == g.shape && d.shape == std::vector<int64_t>{H});
          for (int64_t i = 0; i < I; ++i) {
            EXPECT_EQ(std::memcmp(g.data + i * es, gu.data + (e * 2 * I + 2 * i) * es, es), 0) << p << " gate " << i;
            EXPECT_EQ(std::memcmp(u.data + i * es, gu.data + (e * 2 * I + 2 * i + 1) * es, es), 0) << p << " up " << i;
          }
          EXPECT_EQ(std::memcmp(d.data, dn.data + e * H * es, H * es), 0) << p << " down";
        }
        // ... and read back to the same model: the export evaluates to the moesq checkpoint's nats, bitwise.
        const std::string flags = " --data " + ids + " --seq-len " + std::to_string(T) + " --json";
        const CmdResult a = run(dir, "eval " + out + flags), b = run(dir, "eval " + ct + flags);
        ASSERT_EQ(b.code, 0) << b.err;
        EXPECT_EQ(json::parse(a.out)["nats_per_token"].get<double>(), json::parse(b.out)["nats_per_token"].get<double>());
        const json ct_ins = json::parse(run(dir, "inspect " + ct + " --json").out);
        int64_t moe_layers = 0;
        for (int64_t l = 0; l < sp.num_layers; ++l) moe_layers += sp.is_moe_layer(l);
        EXPECT_EQ(ct_ins["not_compressed"]["expert_bias"].get<int64_t>(), 3 * sp.num_experts * moe_layers);
      }
    }
    const moesq::model::DecoderModel m(dst);
    EXPECT_EQ(m.expert_format(), "paired-4:8-nvfp4");
    EXPECT_TRUE(m.default_forward_options().act_quant) << "a compressed checkpoint evaluates W4A4";
    const CmdResult e = run(dir, "eval " + out + " --data " + ids + " --seq-len " + std::to_string(T) + " --json");
    ASSERT_EQ(e.code, 0) << e.err;
    const double nats = json::parse(e.out)["nats_per_token"].get<double>();
    std::printf("%s %s: %.6f nats/token (source %.6f)\n", arch.c_str(), method.c_str(), nats, src_nats);
    EXPECT_TRUE(std::isfinite(nats));
    EXPECT_NE(nats, src_nats) << arch << ": compression changed nothing";
    EXPECT_NEAR(nats, src_nats, kCompressedNatsAtol) << arch << " " << method;
  }
}

// `generate --device cpu` (model::KvDecoder, one token per step) against the full forward: each greedy
// id must be the argmax of DecoderModel::forward over the prompt + the ids before it (teacher-forced on
// the generated ids, so a near-tie — top-1/top-2 gap ≤ kTieGap, skipped — does not derail the rest).
// 8 prompt + 72 new tokens pass gpt-oss's sliding_window of 64, so the window acts on the decode path.
TEST_P(CliFamilies, GenerateGreedyFollowsTheFullForward) {
  const std::string arch = GetParam();
  moesq::test::TempDir dir("moesq_fam_generate");
  const std::vector<int32_t> prompt = {3, 141, 59, 26, 5, 35, 89, 79};
  std::string text;
  for (int32_t id : prompt) text += std::to_string(id) + " ";
  const std::string ids_file = dir.write("prompt.txt", text);
  constexpr int64_t kNew = 72;
  constexpr double kTieGap = 1e-4;  // > the decode-vs-forward logit error (≤ 4e-6, test_family_parity.cpp)
  const CmdResult r = run(dir, "generate " + fixture("tiny-" + arch) + " --prompt-ids " + ids_file +
                                   " --device cpu --max-new-tokens " + std::to_string(kNew) + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const std::vector<int32_t> gen = json::parse(r.out).at("generated_ids").get<std::vector<int32_t>>();
  ASSERT_EQ(static_cast<int64_t>(gen.size()), kNew) << r.out;
  const moesq::io::Checkpoint ck(fixture("tiny-" + arch));
  const moesq::model::DecoderModel m(ck);
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), gen.begin(), gen.end() - 1);
  const std::vector<float> z = m.forward(seq, m.default_forward_options());  // [seq, V]
  const int64_t V = m.spec().vocab_size, P = static_cast<int64_t>(prompt.size());
  int64_t checked = 0;
  for (int64_t i = 0; i < kNew; ++i) {
    const float* row = &z[(P - 1 + i) * V];
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > row[best]) best = v;
    float second = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      if (v != best) second = std::max(second, row[v]);
    if (row[best] - second <= kTieGap) continue;
    ++checked;
    EXPECT_EQ(gen[i], best) << arch << ": generated token " << i;
  }
  std::printf("%s: generate matches the full forward's argmax on %lld of %lld tokens (rest near-ties)\n",
              arch.c_str(), static_cast<long long>(checked), static_cast<long long>(kNew));
  EXPECT_GE(checked, kNew / 2) << arch << ": too many near-ties to check anything";
}

INSTANTIATE_TEST_SUITE_P(Families, CliFamilies, ::testing::Values("qwen2-moe", "mixtral", "olmoe", "deepseek-v3", "gpt-oss"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
