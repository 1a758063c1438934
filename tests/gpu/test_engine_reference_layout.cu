// The paper's reference layout through the GPU engine (issue 27): MOESQ_TINY_COMPRESSED (a paired 4:8
// moesq checkpoint, made by the device script) exported as compressed-tensors at group 32, rewritten by
// tests/support/reference_layout.h as the reference writes its checkpoints (one shard per layer, 0-d
// input_global_scale, `re:` ignores) — once with gate and up sharing γ, once with up's γ and block scales
// doubled / halved exactly (separate global scales, the same weights). For every backend the engine's
// logits of both are BITWISE those of the moesq checkpoint: the same bytes upload for the shared-γ one;
// for the separate one the up rows' epilogue factor 1/γ_up = 2^∓1/γ and their sums 2^±1 times as large
// are exact power-of-two scalings. Decoding up with the gate's γ would be off by 2× on those rows.
// And static activation scales (input_activations.dynamic false, each expert's stored
// input_global_scale as its γ_a): the engine's nats are the CPU forward's within the W4A4 bound
// (on the mean over windows; kStaticOverDynamic).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/checkpoint.h"
#include "io/export_checkpoint.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/tensor_math.h"
#include "runtime/engine.h"
#include "support/gpu_test_main.h"
#include "support/reference_layout.h"
#include "support/temp_dir.h"
#include "support/text_tokens.h"

using namespace moesq;

namespace {

// tests/gpu/test_engine.cu's W4A4 bound (floors: 3.0e-2 from bf16 K/V, 1.4e-2 from summation order).
constexpr double kW4A4NatsTol = 5e-2;
// The static-γ windows below are short (40–67 tokens), so one activation-quant rounding flip moves a
// window's mean further than on test_engine.cu's windows. Measured on the H200 (session 19) on these four
// windows, GPU − CPU: dynamic scales +9.3e-2, +3.1e-2, −10.7e-2, −5.0e-2 (mean |·| 7.0e-2); static γ
// +5.0e-2, +2.6e-2, −6.0e-2, −0.3e-2 (mean 3.5e-2). So static γ is held to the W4A4 bound on the MEAN
// |GPU − CPU| over the windows, or to the dynamic spread measured in the same run if that is wider
// (static γ must not widen it by more than kStaticOverDynamic), and each window to twice the bound.
// A wrong γ (not applied, off by a power of two) moves every window by tenths of a nat.
constexpr double kStaticOverDynamic = 1.25;

std::string compressed() {
  const char* p = std::getenv("MOESQ_TINY_COMPRESSED");
  return p ? p : "";
}

// All-position logits of four windows in one batched prefill.
std::vector<float> logits_of(const std::string& dir, runtime::ExpertBackend backend) {
  const io::Checkpoint ckpt(dir);
  runtime::EngineOptions opt;
  opt.experts = backend, opt.max_seqs = 4, opt.max_len = 96;
  runtime::Engine eng(ckpt, opt);
  std::vector<runtime::SeqChunk> chunks;
  for (int w = 0; w < 4; ++w) chunks.push_back({w, test::text_tokens(40 + 9 * w, 300 + w)});
  return eng.forward(chunks, true);
}

// A copy of the compressed-tensors export `src` with input_activations.dynamic false in every config
// group and each input_global_scale set to γ_a = 2688 / A: A = 8 (gate|up input) or 4 (down input)
// times 1 + (expert % 5) / 4 — per-expert static scales, gate and up equal (as the format requires).
void write_static_act_variant(const std::string& src, const std::string& dst) {
  namespace fs = std::filesystem;
  fs::remove_all(dst);
  fs::copy(src, dst, fs::copy_options::recursive);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dst + "/config.json"));
  for (auto& [name, g] : cfg["quantization_config"]["config_groups"].items())
    if (!g["input_activations"].is_null()) g["input_activations"]["dynamic"] = false;
  std::ofstream(dst + "/config.json") << cfg.dump(2);
  const std::string suffix = ".input_global_scale";
  for (const auto& f : fs::directory_iterator(dst)) {
    if (f.path().extension() != ".safetensors") continue;
    io::SafetensorsWriter w;
    {
      const io::SafetensorsFile in(f.path().string());
      for (const std::string& n : in.names()) {
        const io::TensorView& t = in.get(n);
        if (n.size() <= suffix.size() || n.compare(n.size() - suffix.size(), suffix.size(), suffix) != 0) {
          w.add(n, t.dtype, t.shape, t.data, t.nbytes);
          continue;
        }
        const size_t at = n.find(".experts.");
        const int e = at == std::string::npos ? 0 : std::atoi(n.c_str() + at + 9);
        const float a = (n.find("down_proj") != std::string::npos ? 4.0f : 8.0f) * (1.0f + (e % 5) / 4.0f);
        const float v = 2688.0f / a;
        w.add(n, io::DType::F32, t.shape, &v, sizeof v);
      }
    }
    w.write(f.path().string());
  }
}

}  // namespace

TEST(EngineReferenceLayout, SharedAndSeparateGateUpGammaGiveTheMoesqLogitsBitwise) {
  ASSERT_FALSE(compressed().empty()) << "set MOESQ_TINY_COMPRESSED";
  test::TempDir dir("moesq_gpu_reference_layout");
  const std::string x32 = dir.file("x32"), same = dir.file("ref-same"), sep = dir.file("ref-separate");
  io::export_checkpoint(compressed(), io::ExportFormat::CompressedTensors, x32, "export.json", 32);
  const int64_t layers = io::Checkpoint(compressed()).spec().num_layers;
  test::write_reference_layout(x32, same, layers);
  const int changed = test::write_reference_layout(x32, sep, layers, true);
  EXPECT_GT(changed, 0);
  std::printf("[reference layout] %d up projections with their own γ\n", changed);
  for (runtime::ExpertBackend b :
       {runtime::ExpertBackend::kSparseW4A4, runtime::ExpertBackend::kSparseW4A16, runtime::ExpertBackend::kBf16}) {
    const std::vector<float> want = logits_of(compressed(), b);
    for (const std::string& d : {same, sep}) {
      const std::vector<float> got = logits_of(d, b);
      ASSERT_EQ(got.size(), want.size());
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
      EXPECT_EQ(differ, 0u) << runtime::expert_backend_name(b) << " " << d << ": " << differ << " of " << got.size()
                            << " logits differ";
    }
  }
}

TEST(EngineReferenceLayout, StaticInputGlobalScaleEvaluatesAsTheCpuForward) {
  ASSERT_FALSE(compressed().empty()) << "set MOESQ_TINY_COMPRESSED";
  test::TempDir dir("moesq_gpu_static_act");
  const std::string x32 = dir.file("x32"), st = dir.file("static");
  io::export_checkpoint(compressed(), io::ExportFormat::CompressedTensors, x32, "export.json", 32);
  write_static_act_variant(x32, st);
  const io::Checkpoint ckpt(st);
  const model::DecoderModel cpu(ckpt);
  model::ForwardOptions fo = cpu.default_forward_options();
  fo.act_quant = true;  // as test_engine.cu's W4A4 check
  if (fo.act_block == 0) fo.act_block = 32;
  const std::vector<float> dyn = logits_of(x32, runtime::ExpertBackend::kSparseW4A4);
  const std::vector<float> got = logits_of(st, runtime::ExpertBackend::kSparseW4A4);
  ASSERT_EQ(got.size(), dyn.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &dyn[i], 4) != 0;
  EXPECT_GT(differ, got.size() / 2) << "the static γ_a changed almost no logit: was it applied?";
  const int64_t V = ckpt.spec().vocab_size;
  // The same windows with dynamic scales (the export x32, CPU and GPU) beside them: whether static γ_a
  // widens the GPU − CPU spread (a bug) or both spreads are alike (the W4A4 rounding floor).
  const io::Checkpoint dyn_ckpt(x32);
  const model::DecoderModel cpu_dyn(dyn_ckpt);
  int64_t row = 0;
  double mean_static = 0, mean_dynamic = 0;
  for (int w = 0; w < 4; ++w) {
    const std::vector<int32_t> toks = test::text_tokens(40 + 9 * w, 300 + w);
    int64_t pred = 0;
    const double c = cpu.window_nll(toks, fo, &pred);
    const double g = model::next_token_nll(got.data() + row * V, toks, V);
    const double cd = cpu_dyn.window_nll(toks, fo, &pred);
    const double gd = model::next_token_nll(dyn.data() + row * V, toks, V);
    row += static_cast<int64_t>(toks.size());
    std::printf("[static act] window %d: static cpu %.6f gpu %.6f diff %.2e nats | dynamic cpu %.6f gpu %.6f diff %.2e\n",
                w, c, g, g - c, cd, gd, gd - cd);
    EXPECT_LE(std::fabs(g - c), 2 * kW4A4NatsTol) << "window " << w;
    mean_static += std::fabs(g - c) / 4, mean_dynamic += std::fabs(gd - cd) / 4;
  }
  std::printf("[static act] mean |gpu - cpu|: static %.2e, dynamic %.2e nats\n", mean_static, mean_dynamic);
  EXPECT_LE(mean_static, std::max(kW4A4NatsTol, kStaticOverDynamic * mean_dynamic));
}

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
