// The paper's reference layout through the GPU engine (issue 27): MOESQ_TINY_COMPRESSED (a paired 4:8
// moesq checkpoint, made by the device script) exported as compressed-tensors at group 32, rewritten by
// tests/support/reference_layout.h as the reference writes its checkpoints (one shard per layer, 0-d
// input_global_scale, `re:` ignores) — once with gate and up sharing γ, once with up's γ and block scales
// doubled / halved exactly (separate global scales, the same weights). For every backend the engine's
// logits of both are BITWISE those of the moesq checkpoint: the same bytes upload for the shared-γ one;
// for the separate one the up rows' epilogue factor 1/γ_up = 2^∓1/γ and their sums 2^±1 times as large
// are exact power-of-two scalings. Decoding up with the gate's γ would be off by 2× on those rows.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/export_checkpoint.h"
#include "runtime/engine.h"
#include "support/gpu_test_main.h"
#include "support/reference_layout.h"
#include "support/temp_dir.h"
#include "support/text_tokens.h"

using namespace moesq;

namespace {

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

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
