// Seed corpora for the fuzz targets, built from the shared fixtures (scripts/fuzz.sh runs it; nothing
// is committed). Usage: fuzz_make_seeds MODELS_DIR TOKENIZERS_DIR CORPUS_DIR OUT_DIR
//   MODELS_DIR      /work/shared/models-style folder (tiny-qwen3-moe/, config-variants/)
//   TOKENIZERS_DIR  folder of tokenizer fixtures (bpe-bytelevel-qwen-style/, bpe-bytefallback-mistral-style/)
//   CORPUS_DIR      text files (shared/data/corpus)
// Writes OUT_DIR/{tokens,tokenizer,plan,compressed,config,safetensors}/seed-*, each in its target's
// input framing (fuzz/fuzz_*.cpp). Real weights are cut to small projections so that every seed is a
// few KiB: libFuzzer mutates small inputs fastest.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "format/nvfp4.h"
#include "io/checkpoint.h"
#include "io/compressed_checkpoint.h"
#include "io/export_checkpoint.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"
#include "audit/plan_json.h"
#include "ops/route_align/route_align.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string slurp(const fs::path& p, size_t max = SIZE_MAX) {
  std::ifstream f(p, std::ios::binary);
  MOESQ_CHECK(f, "cannot read ", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  if (s.size() > max) s.resize(max);
  return s;
}

int g_count = 0;
void put(const fs::path& dir, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / ("seed-" + std::to_string(g_count++)), std::ios::binary) << bytes;
}

// .npy v1 / v2 of `ids` with dtype `descr` and `shape`.
std::string npy(const std::vector<uint32_t>& ids, const std::string& descr, const std::string& shape, int version) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t pre = version == 1 ? 10 : 12;
  while ((pre + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  const uint32_t n = static_cast<uint32_t>(header.size());
  for (size_t i = 0; i < (version == 1 ? 2u : 4u); ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  for (uint32_t v : ids)
    for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

void token_seeds(const fs::path& corpus, const fs::path& out) {
  std::vector<std::string> texts;
  for (const auto& e : fs::directory_iterator(corpus)) texts.push_back(slurp(e.path(), 600));
  for (size_t i = 0; i < texts.size(); ++i) {
    // byte 0: text reader, split i % 3, vocab 256 (index 4); byte 1: window length.
    put(out, std::string{static_cast<char>((4 << 3) | ((i % 3) << 1)), 64} + texts[i]);
    std::vector<uint32_t> ids(texts[i].begin(), texts[i].begin() + 96);
    for (auto& v : ids) v &= 0xff;
    put(out, std::string{static_cast<char>((4 << 3) | 1), 32} + npy(ids, "<i4", "(96,)", 1));
    put(out, std::string{static_cast<char>((5 << 3) | 1 | 2), 16} + npy(ids, "<u4", "(4, 24)", 2));
  }
}

// A tokenizer.json cut to its first `keep` vocabulary ids and the merges among them, every
// component kept: small enough to mutate, the same structure as the fixture.
std::string shrink_tokenizer(const fs::path& file, int keep) {
  json t = json::parse(slurp(file));
  json vocab = json::object();
  for (auto it = t["model"]["vocab"].begin(); it != t["model"]["vocab"].end(); ++it)
    if (it.value().get<int>() < keep) vocab[it.key()] = it.value();
  json merges = json::array();
  for (const json& m : t["model"]["merges"]) {
    std::string a, b;
    if (m.is_array()) {
      a = m[0];
      b = m[1];
    } else {
      const std::string s = m;
      a = s.substr(0, s.find(' '));
      b = s.substr(s.find(' ') + 1);
    }
    if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(m);
  }
  t["model"]["vocab"] = vocab;
  t["model"]["merges"] = merges;
  json added = json::array();
  int next = keep;
  for (json a : t["added_tokens"]) {
    a["id"] = next++;
    added.push_back(a);
  }
  t["added_tokens"] = added;
  return t.dump();
}

void tokenizer_seeds(const fs::path& tokenizers, const fs::path& corpus, const fs::path& out) {
  for (const char* name : {"bpe-bytelevel-qwen-style", "bpe-bytefallback-mistral-style"}) {
    const fs::path dir = tokenizers / name;
    put(out, std::string(1, '\0') + shrink_tokenizer(dir / "tokenizer.json", 300));
    const json ref = json::parse(slurp(dir / "reference_encodings.json"));
    int n = 0;
    for (const json& r : ref) {
      std::string text = r.at("text");
      if (text.size() > 300) text.resize(300);
      put(out, std::string(1, '\1') + text);
      if (++n == 24) break;
    }
  }
  for (const auto& e : fs::directory_iterator(corpus)) put(out, std::string(1, '\3') + slurp(e.path(), 400));
}

void plan_seeds(const fs::path& out) {
  using namespace moesq::audit;
  using namespace moesq::ops;
  const std::vector<int32_t> ids = make_fixture_topk_ids(0);
  put(out, alignment_to_json(align_routes(ids, kFixtureM, kFixtureTopk, kFixtureExperts, kFixtureBlock,
                                          AlignOrder::Canonical)).dump());
  put(out, alignment_to_json(align_routes(ids, kFixtureM, kFixtureTopk, kFixtureExperts, kFixtureBlock,
                                          AlignOrder::Native, 7)).dump());
  // A small valid plan of other top-k ids (M = 3, k = 2, E = 4, b = 2): also a plan the fixture refuses.
  put(out, alignment_to_json(align_routes({0, 1, 1, 2, 3, 0}, 3, 2, 4, 2, AlignOrder::Canonical)).dump());
}

// ---- compressed checkpoints ---------------------------------------------------------------------

constexpr int64_t kH = 32, kI = 32, kE = 2;

json small_config(const fs::path& models) {
  json c = json::parse(slurp(models / "tiny-qwen3-moe" / "config.json"));
  c["hidden_size"] = kH;
  c["moe_intermediate_size"] = kI;
  c["intermediate_size"] = 64;
  c["num_hidden_layers"] = 1;
  c["num_local_experts"] = kE;
  c["num_experts_per_tok"] = 2;
  c["num_attention_heads"] = 2;
  c["num_key_value_heads"] = 1;
  c["head_dim"] = 16;
  return c;
}

// [N, K] top-left corner of a real fixture projection (layer 0, expert e).
std::vector<float> weight(const moesq::io::Checkpoint& ck, int64_t e, moesq::io::ExpertProj p, int64_t N, int64_t K) {
  const std::string name = moesq::io::expert_tensor_prefix(ck.spec(), 0, e, p) + moesq::io::kWeight;
  const moesq::io::TensorView& t = ck.get(name);
  const std::vector<float> full = moesq::io::to_f32(t);
  const int64_t cols = t.shape[1];
  std::vector<float> w(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = full[n * cols + k];
  return w;
}

// kind: 0 dense bf16, 1 moesq nvfp4, 2 moesq paired 4:8, 3 paired 4:8 with one projection left dense.
void write_small_checkpoint(const moesq::io::Checkpoint& src, const json& cfg0, int kind, const fs::path& dir) {
  using namespace moesq;
  fs::create_directories(dir);
  json cfg = cfg0;
  if (kind != 0) cfg["quantization_config"] = io::quantization_config_json(kind != 1, "rtn");
  std::ofstream(dir / "config.json") << cfg.dump(1);
  io::SafetensorsWriter w;
  for (int64_t e = 0; e < kE; ++e)
    for (int p = 0; p < 3; ++p) {
      const auto proj = static_cast<io::ExpertProj>(p);
      const int64_t N = proj == io::ExpertProj::Down ? kH : kI, K = proj == io::ExpertProj::Down ? kI : kH;
      const std::vector<float> W = weight(src, e, proj, N, K);
      const std::string prefix = io::expert_tensor_prefix(src.spec(), 0, e, proj);  // the source's family names
      if (kind == 0 || (kind == 3 && e == 1 && p == 2)) {
        std::vector<uint16_t> b(W.size());
        for (size_t i = 0; i < W.size(); ++i) b[i] = f32_to_bf16(W[i]);
        w.add(prefix + io::kWeight, io::DType::BF16, {N, K}, b.data(), b.size() * 2);
      } else if (kind == 1) {
        io::add_packed_weight(w, prefix, format::nvfp4_quantize(W.data(), N, K));
      } else {
        const std::vector<uint8_t> pat = format::magnitude_patterns(W.data(), N, K);
        io::add_packed_weight(w, prefix, format::sparse48_quantize(W.data(), N, K, pat.data()));
      }
    }
  w.write((dir / "model.safetensors").string());
}

std::string frame(const fs::path& dir) {
  const std::string cfg = slurp(dir / "config.json");
  std::string out;
  for (int i = 0; i < 4; ++i) out += static_cast<char>((cfg.size() >> (8 * i)) & 0xff);
  return out + cfg + slurp(dir / "model.safetensors");
}

void compressed_seeds(const fs::path& models, const fs::path& out, const fs::path& scratch) {
  const moesq::io::Checkpoint src((models / "tiny-qwen3-moe").string());
  const json cfg = small_config(models);
  for (int kind = 0; kind < 4; ++kind) {
    const fs::path d = scratch / ("kind" + std::to_string(kind));
    write_small_checkpoint(src, cfg, kind, d);
    put(out, frame(d));
  }
  // The compressed-tensors layouts, as `moesq export` writes them, of the paired 4:8 checkpoint.
  const moesq::io::Checkpoint paired((scratch / "kind2").string());
  for (auto f : {moesq::io::ExportFormat::CompressedTensors, moesq::io::ExportFormat::PairBitmask}) {
    const fs::path d = scratch / moesq::io::export_format_name(f);
    fs::create_directories(d);
    moesq::io::write_exported_checkpoint(paired, f, d.string());
    put(out, frame(d));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODELS_DIR TOKENIZERS_DIR CORPUS_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path models = argv[1], tokenizers = argv[2], corpus = argv[3], out = argv[4];
  try {
    const fs::path scratch = out / ".scratch";
    token_seeds(corpus, out / "tokens");
    tokenizer_seeds(tokenizers, corpus, out / "tokenizer");
    plan_seeds(out / "plan");
    compressed_seeds(models, out / "compressed", scratch);
    if (fs::is_directory(models / "config-variants"))
      for (const auto& e : fs::directory_iterator(models / "config-variants"))
        if (e.path().extension() == ".json") put(out / "config", slurp(e.path()));
    for (const auto& e : fs::directory_iterator(models))
      if (fs::exists(e.path() / "config.json")) put(out / "config", slurp(e.path() / "config.json"));
    put(out / "safetensors", slurp(scratch / "kind1" / "model.safetensors"));
    put(out / "safetensors", slurp(scratch / "compressed-tensors" / "model.safetensors"));
    fs::remove_all(scratch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_make_seeds: %s\n", e.what());
    return 1;
  }
  std::printf("fuzz_make_seeds: %d seeds in %s\n", g_count, out.c_str());
  return 0;
}
