// Bad input end to end (docs/RELIABILITY.md): copies of the embedded model damaged in one
// place — a NaN in one bf16 expert weight, a NaN block-scale code in a packed tensor, config fields
// that change the math, a half-compressed checkpoint — run through the built binary. Each must
// either give the right answer or exit non-zero with a message naming the tensor / field and file;
// never a plausible number.
#include <gtest/gtest.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "support/cli_run.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using moesq::test::CliRun;
using moesq::test::slurp;

class BadInput : public ::testing::Test {
 protected:
  moesq::test::TempDir tmp_{"moesq_test_bad_input"};

  CliRun run(const std::string& args) { return moesq::test::run_moesq(args, tmp_.path.string()); }

  // A private copy of the embedded model (files copied, so they can be damaged).
  fs::path copy_model(const std::string& name) {
    const fs::path dst = tmp_.path / name;
    fs::create_directories(dst);
    for (const auto& e : fs::directory_iterator(MOESQ_DEFAULT_MODEL)) fs::copy_file(e.path(), dst / e.path().filename());
    return dst;
  }

  // Text of `bytes` pseudo-random printable bytes (fixed seed): eval data.
  fs::path text(size_t bytes, unsigned seed) {
    std::mt19937 rng(seed);
    std::string s(bytes, ' ');
    for (char& c : s) c = static_cast<char>('a' + rng() % 26);
    return tmp_.write("data_" + std::to_string(seed) + ".txt", s);
  }

  fs::path dir() const { return tmp_.path; }
};

// Where tensor `name` lives: its shard file and its byte offset in that file.
struct TensorLoc {
  fs::path file;
  uint64_t offset = 0;  // of the first data byte
  json entry;
};
TensorLoc locate(const fs::path& ckpt, const std::string& name) {
  for (const auto& e : fs::directory_iterator(ckpt)) {
    if (e.path().extension() != ".safetensors") continue;
    const std::string bytes = slurp(e.path());
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    const json h = json::parse(bytes.substr(8, n));
    if (!h.contains(name)) continue;
    return {e.path(), 8 + n + h[name]["data_offsets"][0].get<uint64_t>(), h[name]};
  }
  ADD_FAILURE() << name << " not in " << ckpt;
  return {};
}
void poke(const fs::path& file, uint64_t offset, const void* data, size_t n) {
  std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

void edit_config(const fs::path& ckpt, const std::function<void(json&)>& edit) {
  json cfg = json::parse(slurp(ckpt / "config.json"));
  edit(cfg);
  std::ofstream(ckpt / "config.json") << cfg.dump(2);
}

// Writes `w` as an extra shard of the sharded checkpoint `ckpt` and points the index at it for every
// tensor it holds (adding or replacing tensors without rewriting the original shards).
void add_shard(const fs::path& ckpt, const std::string& shard, const moesq::io::SafetensorsWriter& w) {
  w.write((ckpt / shard).string());
  json index = json::parse(slurp(ckpt / "model.safetensors.index.json"));
  for (const std::string& name : w.names()) index["weight_map"][name] = shard;
  std::ofstream(ckpt / "model.safetensors.index.json") << index.dump(2);
}

double nats(const CliRun& r) { return json::parse(r.out).at("nats_per_token").get<double>(); }

constexpr const char* kGate3 = "model.layers.1.mlp.experts.3.gate_proj";

// ---- class 1: non-finite values --------------------------------------------------------------

// One NaN in one bf16 expert weight: eval must fail naming the tensor and its file, with activation
// quantization (where the quantizer used to map the NaN to +0 and print 0.8744) and without.
TEST_F(BadInput, NanInOneBf16ExpertWeightFailsNamingTensorAndFile) {
  const fs::path m = copy_model("nan");
  const TensorLoc loc = locate(m, std::string(kGate3) + ".weight");
  ASSERT_EQ(loc.entry["dtype"], "BF16");
  const uint16_t nan = 0x7fc0;
  poke(loc.file, loc.offset + 2 * 77, &nan, 2);
  const fs::path data = text(300, 1);
  for (const char* aq : {"nvfp4", "none"}) {
    const CliRun r = run("eval '" + m.string() + "' --data '" + data.string() + "' --json --act-quant " + aq);
    EXPECT_NE(r.rc, 0) << aq << ": " << r.out;
    EXPECT_EQ(r.out.find("nats"), std::string::npos) << "no number for a NaN model: " << r.out;
    EXPECT_NE(r.err.find(std::string(kGate3) + ".weight"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(loc.file.filename().string()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("non-finite"), std::string::npos) << r.err;
  }
  // compress reads the same weights: the same error, and no OUT.
  const CliRun c = run("compress '" + m.string() + "' --method rtn-nvfp4 --out '" + (dir() / "out").string() + "'");
  EXPECT_NE(c.rc, 0);
  EXPECT_NE(c.err.find(std::string(kGate3) + ".weight"), std::string::npos) << c.err;
  EXPECT_FALSE(fs::exists(dir() / "out"));
}

// An inf in a non-expert weight (the embedding) is caught the same way.
TEST_F(BadInput, InfInTheEmbeddingFailsNamingIt) {
  const fs::path m = copy_model("inf");
  const TensorLoc loc = locate(m, "model.embed_tokens.weight");
  const uint16_t inf = loc.entry["dtype"] == "BF16" ? 0x7f80 : 0x7c00;
  poke(loc.file, loc.offset + 2 * 5, &inf, 2);
  const CliRun r = run("eval '" + m.string() + "' --data '" + text(200, 2).string() + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("model.embed_tokens.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("inf"), std::string::npos) << r.err;
}

// ---- class 2: config fields that change the math ------------------------------------------

// attention_bias: true with q/k/v/o biases: all-zero biases give the bias-free model's number
// bit for bit, non-zero ones change it (they are used), a missing bias is an error naming it.
TEST_F(BadInput, AttentionBiasIsApplied) {
  const fs::path data = text(400, 3);
  const std::string tail = "' --data '" + data.string() + "' --json --seq-len 128";
  const CliRun base = run("eval '" + std::string(MOESQ_DEFAULT_MODEL) + tail);
  ASSERT_EQ(base.rc, 0) << base.err;
  const int64_t H = 256, qw = 4 * 64, kw = 2 * 64;  // tiny model: H, nh·hd, nkv·hd
  auto biased = [&](const std::string& name, float value, bool drop_o_bias) {
    const fs::path m = copy_model(name);
    edit_config(m, [](json& c) { c["attention_bias"] = true; });
    moesq::io::SafetensorsWriter w;
    for (int l = 0; l < 4; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
      for (auto [proj, n] : {std::pair{"q_proj", qw}, {"k_proj", kw}, {"v_proj", kw}, {"o_proj", H}}) {
        if (drop_o_bias && std::string(proj) == "o_proj" && l == 2) continue;
        std::vector<float> b(n);
        for (int64_t i = 0; i < n; ++i) b[i] = value * static_cast<float>((i * 7) % 5 - 2);
        w.add_f32(p + proj + ".bias", {n}, b);
      }
    }
    add_shard(m, "model-bias.safetensors", w);
    return m;
  };
  const CliRun zero = run("eval '" + biased("zero", 0.0f, false).string() + tail);
  ASSERT_EQ(zero.rc, 0) << zero.err;
  EXPECT_EQ(nats(zero), nats(base));
  const CliRun some = run("eval '" + biased("some", 0.05f, false).string() + tail);
  ASSERT_EQ(some.rc, 0) << some.err;
  EXPECT_NE(nats(some), nats(base));
  const CliRun missing = run("eval '" + biased("missing", 0.05f, true).string() + tail);
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.err.find("model.layers.2.self_attn.o_proj.bias"), std::string::npos) << missing.err;
}

// tie_word_embeddings: true with an lm_head.weight present: transformers ties the head to the
// embedding (the stored head is ignored); so does moesq — the number changes, and equals the one
// of a model whose stored lm_head IS the embedding.
TEST_F(BadInput, TiedEmbeddingsWinOverAStoredLmHead) {
  const fs::path data = text(300, 4);
  const std::string tail = "' --data '" + data.string() + "' --json --seq-len 128";
  const fs::path tied = copy_model("tied");
  edit_config(tied, [](json& c) { c["tie_word_embeddings"] = true; });
  // The same head written out explicitly: lm_head.weight := embed_tokens.weight, untied.
  const fs::path explicit_head = copy_model("explicit");
  {
    const TensorLoc emb = locate(explicit_head, "model.embed_tokens.weight");
    const moesq::io::SafetensorsFile f(emb.file.string());
    const moesq::io::TensorView& t = f.get("model.embed_tokens.weight");
    moesq::io::SafetensorsWriter w;
    w.add("lm_head.weight", t.dtype, t.shape, t.data, t.nbytes);
    add_shard(explicit_head, "model-head.safetensors", w);
  }
  const CliRun base = run("eval '" + std::string(MOESQ_DEFAULT_MODEL) + tail), rt = run("eval '" + tied.string() + tail),
               re = run("eval '" + explicit_head.string() + tail);
  ASSERT_EQ(base.rc, 0) << base.err;
  ASSERT_EQ(rt.rc, 0) << rt.err;
  ASSERT_EQ(re.rc, 0) << re.err;
  EXPECT_NE(nats(rt), nats(base));
  EXPECT_EQ(nats(rt), nats(re));
}

// A DeepSeek-style FP8 config (quant_method "fp8", weight_block_size) is refused naming the field
// and value (it used to fail with "missing string key format"); so is any other quant_method.
TEST_F(BadInput, ForeignQuantMethodIsRefusedByName) {
  const fs::path data = text(200, 5);
  for (const char* method : {"fp8", "gptq"}) {
    const fs::path m = copy_model(std::string("q_") + method);
    edit_config(m, [&](json& c) {
      c["quantization_config"] = {{"quant_method", method}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
    });
    for (const char* cmd : {"eval", "inspect"}) {
      const std::string args = std::string(cmd) + " '" + m.string() + "'" +
                               (std::string(cmd) == "eval" ? " --data '" + data.string() + "'" : std::string());
      const CliRun r = run(args);
      EXPECT_NE(r.rc, 0) << cmd << " " << method;
      EXPECT_NE(r.err.find("quant_method"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(method), std::string::npos) << r.err;
    }
  }
}

// A moesq quantization_config with a format moesq does not know: refused naming field and value.
TEST_F(BadInput, UnknownMoesqFormatIsRefusedByName) {
  const fs::path m = copy_model("q_int3");
  edit_config(m, [](json& c) { c["quantization_config"] = {{"quant_method", "moesq"}, {"format", "int3"}}; });
  const CliRun r = run("eval '" + m.string() + "' --data '" + text(200, 13).string() + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("quantization_config.format = \"int3\""), std::string::npos) << r.err;
}

// An F8_E4M3 weight (FP8 block-quantized, weight_scale_inv beside it) is refused by tensor name,
// never read as raw E4M3 codes.
TEST_F(BadInput, Fp8WeightIsRefusedByName) {
  const fs::path m = copy_model("fp8w");
  const std::string name = "model.layers.0.self_attn.q_proj.weight";
  moesq::io::SafetensorsWriter w;
  std::vector<uint8_t> codes(256 * 256, 0x38);  // 1.0 in E4M3
  w.add(name, moesq::io::DType::F8_E4M3, {256, 256}, codes.data(), codes.size());
  const std::vector<float> inv(4, 1.0f);
  w.add_f32("model.layers.0.self_attn.q_proj.weight_scale_inv", {2, 2}, inv);
  add_shard(m, "model-fp8.safetensors", w);
  const CliRun r = run("eval '" + m.string() + "' --data '" + text(200, 6).string() + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("F8_E4M3"), std::string::npos) << r.err;
}

// ---- classes 3 and 4: half-compressed checkpoints, format errors that name nothing -----------

// One rtn-nvfp4 compression of the embedded model, shared by the tests below (copied per test).
// One compression of the embedded model per method, shared by the tests below (copied per test):
// rtn-nvfp4 (dense NVFP4) and magnitude (paired 4:8, with .weight_meta).
fs::path compress_once(const std::string& method) {
  static moesq::test::TempDir dir("moesq_test_bad_input_out");
  static std::map<std::string, fs::path> done;
  fs::path& out = done[method];
  if (out.empty()) {
    std::string calib(3000, ' ');
    for (size_t i = 0; i < calib.size(); ++i) calib[i] = static_cast<char>('a' + (i * 7919) % 26);
    const std::string c = dir.write("calib.txt", calib);
    const fs::path o = dir.path / method;
    const std::string cmd = "MOESQ_QUIET=1 '" + std::string(MOESQ_BINARY) + "' compress '" + MOESQ_DEFAULT_MODEL +
                            "' --method " + method + " --out '" + o.string() + "' --calib '" + c +
                            "' --calib-samples 4 --seq-len 64 >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    out = o;
  }
  return out;
}
const fs::path& compressed_model() {
  static const fs::path p = compress_once("rtn-nvfp4");
  return p;
}

fs::path copy_dir(const fs::path& src, const fs::path& dst) {
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), dst / e.path().filename());
  return dst;
}

// Rewrites the single-file checkpoint `ckpt` with projection `prefix` stored as the original dense
// bf16 .weight instead of its packed tensors.
void unpack_one_projection(const fs::path& ckpt, const std::string& prefix) {
  const fs::path file = ckpt / "model.safetensors";
  moesq::io::SafetensorsWriter w;
  {
    const moesq::io::SafetensorsFile f(file.string());
    for (const std::string& name : f.names()) {
      if (name.rfind(prefix + ".", 0) == 0) continue;
      const moesq::io::TensorView& t = f.get(name);
      w.add(name, t.dtype, t.shape, t.data, t.nbytes);
    }
    const TensorLoc orig = locate(MOESQ_DEFAULT_MODEL, prefix + ".weight");
    const moesq::io::SafetensorsFile of(orig.file.string());
    const moesq::io::TensorView& t = of.get(prefix + ".weight");
    w.add(prefix + ".weight", t.dtype, t.shape, t.data, t.nbytes);
  }
  w.write(file.string());
}

TEST_F(BadInput, HalfCompressedCheckpointIsRefusedUnlessAllowMixed) {
  ASSERT_TRUE(fs::is_regular_file(compressed_model() / "model.safetensors"));
  const fs::path m = copy_dir(compressed_model(), dir() / "mixed");
  unpack_one_projection(m, kGate3);
  const fs::path data = text(200, 7);
  const CliRun e = run("eval '" + m.string() + "' --data '" + data.string() + "' --json");
  EXPECT_NE(e.rc, 0);
  EXPECT_NE(e.err.find(std::string(kGate3) + ".weight"), std::string::npos) << e.err;
  EXPECT_NE(e.err.find("--allow-mixed"), std::string::npos) << e.err;
  const CliRun i = run("inspect '" + m.string() + "' --json");
  EXPECT_NE(i.rc, 0);
  EXPECT_NE(i.err.find(std::string(kGate3) + ".weight"), std::string::npos) << i.err;

  const CliRun ea = run("eval '" + m.string() + "' --data '" + data.string() + "' --json --allow-mixed");
  EXPECT_EQ(ea.rc, 0) << ea.err;
  const CliRun ia = run("inspect '" + m.string() + "' --json --allow-mixed");
  ASSERT_EQ(ia.rc, 0) << ia.err;
  const json j = json::parse(ia.out);
  EXPECT_EQ(j.at("expert_storage"), "mixed");
  EXPECT_EQ(j.at("expert_projections_packed").get<int64_t>(), 4 * 32 * 3 - 1);
  EXPECT_EQ(j.at("expert_projections_dense").get<int64_t>(), 1);
  const CliRun it = run("inspect '" + m.string() + "' --allow-mixed");
  EXPECT_NE(it.out.find("MIXED"), std::string::npos) << it.out;
  EXPECT_EQ(it.out.find("compressed      yes"), std::string::npos) << it.out;

  // The intact output: all packed, reported so.
  const CliRun ok = run("inspect '" + compressed_model().string() + "' --json");
  ASSERT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(json::parse(ok.out).at("expert_storage"), "packed");
  EXPECT_EQ(json::parse(ok.out).at("expert_projections_dense").get<int64_t>(), 0);
}

// A NaN block-scale code (0x7f) or a sign bit (0xff) in a packed tensor: the error names the tensor
// and the file, not just "block scale 5 has code 0x7f".
TEST_F(BadInput, NanBlockScaleCodeNamesTensorAndFile) {
  for (uint8_t code : {uint8_t{0x7f}, uint8_t{0xff}}) {
    const fs::path m = copy_dir(compressed_model(), dir() / ("scale_" + std::to_string(code)));
    const TensorLoc loc = locate(m, std::string(kGate3) + ".weight_scale");
    ASSERT_EQ(loc.entry["dtype"], "F8_E4M3");
    poke(loc.file, loc.offset + 5, &code, 1);
    const CliRun r = run("eval '" + m.string() + "' --data '" + text(200, 8).string() + "'");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.err.find(kGate3), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("block scale 5"), std::string::npos) << r.err;
  }
}

// A metadata nibble that is none of the 6 paired 4:8 patterns: named with tensor and file.
TEST_F(BadInput, BadMetadataNibbleNamesTensorAndFile) {
  const fs::path src = compress_once("magnitude");
  const fs::path m = copy_dir(src, dir() / "nibble");
  const TensorLoc loc = locate(m, std::string(kGate3) + ".weight_meta");
  const uint8_t bad = 0x00;  // nibble 0: pairs {0, 0}
  poke(loc.file, loc.offset + 3, &bad, 1);
  const CliRun r = run("eval '" + m.string() + "' --data '" + text(200, 14).string() + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find(kGate3), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.safetensors"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("metadata nibble 0x0"), std::string::npos) << r.err;
}

// ---- class 6: write failures -----------------------------------------------------------------

// Entries of `dir` whose name starts with `prefix` (leftover temporaries).
std::vector<std::string> entries_with_prefix(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
  return out;
}

std::string compress_args(const fs::path& out, const fs::path& calib) {
  return "compress '" + std::string(MOESQ_DEFAULT_MODEL) + "' --method rtn-nvfp4 --out '" + out.string() +
         "' --calib '" + calib.string() + "' --calib-samples 4 --seq-len 64";
}

// `ulimit -f 100` (51 200 bytes): the checkpoint write hits EFBIG. moesq ignores SIGXFSZ, so it
// exits 1 with an error naming the file and "File too large", and leaves neither OUT nor OUT.tmp.*.
TEST_F(BadInput, FileSizeLimitFailsCleanly) {
  const fs::path calib = text(3000, 9), out = dir() / "out";
  const std::string cmd = "ulimit -f 100; MOESQ_QUIET=1 '" + std::string(MOESQ_BINARY) + "' " +
                          compress_args(out, calib) + " 2>'" + (dir() / "err.txt").string() + "'";
  const int st = std::system(("sh -c \"" + cmd + "\"").c_str());
  ASSERT_TRUE(WIFEXITED(st)) << "killed by a signal (SIGXFSZ not ignored?)";
  EXPECT_EQ(WEXITSTATUS(st), 1);
  const std::string err = slurp(dir() / "err.txt");
  EXPECT_NE(err.find("File too large"), std::string::npos) << err;
  EXPECT_NE(err.find(out.string()), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(entries_with_prefix(dir(), "out.").empty());
}

// A read-only parent: refused up front naming --out (root ignores permission bits: skipped there).
TEST_F(BadInput, ReadOnlyParentFailsCleanly) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: permission bits do not apply";
  const fs::path ro = dir() / "ro";
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  const CliRun r = run(compress_args(ro / "out", text(3000, 10)));
  fs::permissions(ro, fs::perms::owner_all);
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--out"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::is_empty(ro));
}

// A killed run leaves OUT.tmp.<pid>; the next run writing OUT removes the orphans whose pid is dead
// (and only those), and a .old.<pid> that a killed commit had moved aside is put back.
TEST_F(BadInput, OrphanedTemporariesOfDeadRunsAreCleaned) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);  // `child` is now a dead pid
  const fs::path out = dir() / "out";
  const fs::path orphan = dir() / ("out.tmp." + std::to_string(child));
  fs::create_directories(orphan);
  std::ofstream(orphan / "model.safetensors") << "partial";
  const fs::path live = dir() / ("out.tmp." + std::to_string(::getpid()));  // a live run's: kept
  fs::create_directories(live);
  const CliRun r = run(compress_args(out, text(3000, 11)));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(fs::exists(orphan));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(out / "report.json"));
  fs::remove_all(live);

  // A commit killed between its two renames: OUT missing, OUT.old.<dead pid> holding it.
  const fs::path old = dir() / ("out.old." + std::to_string(child));
  fs::rename(out, old);
  const CliRun e = run("inspect '" + (dir() / "elsewhere").string() + "'");  // unrelated: touches nothing
  EXPECT_NE(e.rc, 0);
  EXPECT_TRUE(fs::exists(old));
  const fs::path out2 = dir() / "out";
  const CliRun r2 = run(compress_args(out2, text(3000, 12)));
  ASSERT_EQ(r2.rc, 0) << r2.err;
  EXPECT_FALSE(fs::exists(old));
  EXPECT_TRUE(fs::exists(out2 / "report.json"));
}

}  // namespace
