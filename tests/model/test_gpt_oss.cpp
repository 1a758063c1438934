// Parity of the gpt-oss CPU forward (model/families/) with transformers' float32 forward of the
// tiny-gpt-oss fixture (../shared/models/README.md): fused interleaved experts with biases,
// clamped SwiGLU, router with bias, attention sinks, sliding-window layers, YaRN RoPE.
//
// Checked: each layer teacher-forced on the reference input (hidden_states.l → .l+1, the last after
// the final norm), router logits and top-k sets; free-running logits; the cross-entropy of
// summary.json; mixers vs their plain-loop twins; decode through the KV caches vs the full forward.
// The fixture's 64-token windows never exceed its sliding_window of 64, so the window itself is
// checked in test_family_mixers.cpp on longer sequences.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "model/families/family_model.h"
#include "support/family_checks.h"

namespace {

using moesq::model::FamilyModel;
using moesq::test::max_abs_diff;

// Same budgets and reasons as test_qwen3_next.cpp.
constexpr double kHiddenAtol = 1e-3;
constexpr double kLogitsAtol = 1e-3;
constexpr double kRouterLogitsAtol = 1e-4;
constexpr double kTieGap = 1e-4;
constexpr double kCeAtol = 1e-4;
constexpr double kTwinAtol = 2e-5;
constexpr double kDecodeAtol = 1e-4;
constexpr const char* kFixture = "tiny-gpt-oss";

class GptOssParity : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = moesq::test::shared_models_dir(kFixture) + "/" + kFixture;
    if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "fixture " << dir << " not present";
    ckpt_ = std::make_unique<moesq::io::Checkpoint>(dir);
    moesq::model::FamilyLoadOptions lo;
    lo.rope_inv_freq_bf16 = true;  // as the reference ran (FamilyLoadOptions)
    model_ = std::make_unique<FamilyModel>(*ckpt_, lo);
    ref_ = moesq::test::load_family_reference(kFixture, model_->spec().num_layers);
  }
  std::unique_ptr<moesq::io::Checkpoint> ckpt_;
  std::unique_ptr<FamilyModel> model_;
  moesq::test::FamilyReference ref_;
};

TEST_F(GptOssParity, ConfigAndLayout) {
  const auto& f = model_->family();
  EXPECT_EQ(f.base.model_type, "gpt_oss");
  EXPECT_EQ(f.layer_mixer[0], moesq::io::MixerKind::SlidingAttention);
  EXPECT_EQ(f.layer_mixer[1], moesq::io::MixerKind::FullAttention);
  EXPECT_EQ(f.sliding_window, 64);
  EXPECT_EQ(f.rope.type, moesq::io::HybridRopeType::Yarn);
  EXPECT_NEAR(f.rope.attention_factor, 0.1 * std::log(32.0) + 1.0, 1e-12);
  EXPECT_FALSE(f.rope.truncate);
  EXPECT_EQ(f.base.moe_intermediate_size, 64);
  EXPECT_EQ(f.base.num_experts, 8);
  EXPECT_TRUE(f.attn_sinks && f.router_bias && f.clamped_swiglu);
  EXPECT_EQ(model_->layer(0).biased_experts.size(), 8u);
}

TEST_F(GptOssParity, LayersTeacherForced) {
  const moesq::test::LayerParity p = moesq::test::teacher_forced_parity(*model_, ref_, kTieGap);
  EXPECT_LE(p.hidden, kHiddenAtol);
  EXPECT_LE(p.router, kRouterLogitsAtol);
  EXPECT_EQ(p.topk_bad, 0);
  EXPECT_LE(p.ties, 4);
  EXPECT_GT(p.min_peak, 0.01);
  std::printf("[ parity ] %s teacher-forced: hidden max err %.3g, router logits %.3g, near-ties %ld\n", kFixture,
              p.hidden, p.router, static_cast<long>(p.ties));
}

TEST_F(GptOssParity, LogitsAndCrossEntropy) {
  const int64_t T = ref_.T, V = model_->spec().vocab_size;
  double nll = 0.0, worst = 0.0;
  for (int64_t b = 0; b < ref_.B; ++b) {
    const std::vector<float> z = model_->forward(ref_.row(b));
    const double err = max_abs_diff(z.data(), &ref_.logits[b * T * V], T * V);
    EXPECT_LE(err, kLogitsAtol) << "seq " << b;
    worst = std::max(worst, err);
    nll += model_->window_nll(ref_.row(b));
  }
  const double ce = nll / static_cast<double>(ref_.B);
  EXPECT_NEAR(ce, ref_.ce, kCeAtol);
  std::printf("[ parity ] %s: logits max err %.3g, CE %.6f vs reference %.6f\n", kFixture, worst, ce, ref_.ce);
  const FamilyModel exact(*ckpt_);  // exact fp32 YaRN frequencies: CE still within budget
  double nll_exact = 0.0;
  for (int64_t b = 0; b < ref_.B; ++b) nll_exact += exact.window_nll(ref_.row(b));
  EXPECT_NEAR(nll_exact / static_cast<double>(ref_.B), ref_.ce, kCeAtol);
  std::printf("[ parity ] %s exact RoPE: CE %.6f\n", kFixture, nll_exact / static_cast<double>(ref_.B));
}

TEST_F(GptOssParity, MixersMatchPlainLoopTwins) {
  EXPECT_LE(moesq::test::mixer_twin_error(*model_, ref_), kTwinAtol);
}

TEST_F(GptOssParity, DecodeEqualsFullForward) {
  EXPECT_LE(moesq::test::decode_error(*model_, ref_.row(0), 5), kDecodeAtol);
}

}  // namespace
