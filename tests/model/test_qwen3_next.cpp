// Parity of the hybrid-family CPU forward (model::DecoderModel with the Gated DeltaNet / gated
// attention mixers of model/mixers/hybrid_mixer.h) with transformers' float32 forward of the
// tiny-qwen3-next and tiny-qwen3.5-moe fixtures (../shared/models/README.md).
//
// Checked per fixture: each decoder layer TEACHER-FORCED on the reference input of that layer
// (hidden_states.l → hidden_states.l+1; the last after the final norm) and its router logits and
// top-k sets; the free-running logits; the cross-entropy of summary.json; every mixer's fast path
// against its plain-loop twin; and token-by-token decode (GDN conv + SSM state, KV caches) against
// the full-sequence forward at the same positions.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config_hybrid.h"
#include "model/decoder.h"
#include "model/kv_decoder.h"
#include "support/family_checks.h"

namespace {

using moesq::model::DecoderModel;
using moesq::test::max_abs_diff;

// Both sides compute in fp32 from the same bf16 weights; differences are summation orders
// (OpenBLAS vs torch GEMMs, the recurrent vs the chunked delta rule), a few ulps per op.
constexpr double kHiddenAtol = 1e-3;        // the bound, on hidden states and logits
constexpr double kLogitsAtol = 1e-3;
constexpr double kRouterLogitsAtol = 1e-4;  // O(1) values: a few ulps of the router GEMM
constexpr double kTieGap = 1e-4;            // top-k may differ only where the reference gap is below this
constexpr double kCeAtol = 1e-4;            // nats/token vs summary.json
// Fast path vs plain-loop twin on the same inputs: only GEMM summation order differs.
constexpr double kTwinAtol = 2e-5;
// Decode (T = 1 steps through the states) vs the full-sequence forward: the recurrence is the
// same code, attention reads the same keys; only GEMM shapes (M = 1 vs M = T) change rounding.
constexpr double kDecodeAtol = 1e-4;

class HybridParity : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = moesq::test::shared_models_dir(GetParam()) + "/" + GetParam();
    if (!std::filesystem::is_directory(dir_)) GTEST_SKIP() << "fixture " << dir_ << " not present";
    ckpt_ = std::make_unique<moesq::io::Checkpoint>(dir_);
    model_ = std::make_unique<DecoderModel>(*ckpt_);
    // The references ran with bf16-rounded RoPE inverse frequencies: match them.
    fo_.rope_bf16_inv_freq = true;
    ref_ = moesq::test::load_family_reference(GetParam(), model_->spec().num_layers);
  }
  std::string dir_;
  std::unique_ptr<moesq::io::Checkpoint> ckpt_;
  std::unique_ptr<DecoderModel> model_;
  moesq::model::ForwardOptions fo_;
  moesq::test::FamilyReference ref_;
};

TEST_P(HybridParity, ConfigAndLayout) {
  const moesq::io::FamilySpec f = moesq::io::parse_family_config(ckpt_->config(), dir_);
  EXPECT_EQ(f.base.model_type, std::string(GetParam()) == "tiny-qwen3-next" ? "qwen3_next" : "qwen3_5_moe_text");
  ASSERT_EQ(f.layer_mixer.size(), 4u);
  EXPECT_EQ(f.layer_mixer[0], moesq::io::MixerKind::GatedDeltaNet);
  EXPECT_EQ(f.layer_mixer[3], moesq::io::MixerKind::FullAttention);
  EXPECT_EQ(f.rope.rotary_dim, 8);  // head_dim 32 · partial_rotary_factor 0.25
  EXPECT_TRUE(f.attn_output_gate);
  EXPECT_EQ(f.shared_expert_intermediate_size, 64);
  EXPECT_EQ(ckpt_->spec().model_type, f.base.model_type);  // io::parse_config accepts the family
}

TEST_P(HybridParity, LayersTeacherForced) {
  const moesq::test::LayerParity p = moesq::test::teacher_forced_parity(*model_, fo_, ref_, kTieGap);
  EXPECT_LE(p.hidden, kHiddenAtol) << GetParam();
  EXPECT_LE(p.router, kRouterLogitsAtol) << GetParam();
  EXPECT_EQ(p.topk_bad, 0) << GetParam();
  EXPECT_LE(p.ties, 4) << "more near-ties than a random-weight router should produce";
  EXPECT_GT(p.min_peak, 0.01);  // no layer output is all zeros
  std::printf("[ parity ] %s teacher-forced: hidden max err %.3g, router logits %.3g, near-ties %ld\n", GetParam(),
              p.hidden, p.router, static_cast<long>(p.ties));
}

TEST_P(HybridParity, LogitsAndCrossEntropy) {
  const int64_t T = ref_.T, V = model_->spec().vocab_size;
  double nll = 0.0, worst = 0.0;
  for (int64_t b = 0; b < ref_.B; ++b) {
    const std::vector<float> z = model_->forward(ref_.row(b), fo_);
    const double err = max_abs_diff(z.data(), &ref_.logits[b * T * V], T * V);
    EXPECT_LE(err, kLogitsAtol) << GetParam() << " seq " << b;
    worst = std::max(worst, err);
    nll += model_->window_nll(ref_.row(b), fo_, nullptr);
  }
  const double ce = nll / static_cast<double>(ref_.B);  // equal-length windows: the token mean
  EXPECT_NEAR(ce, ref_.ce, kCeAtol) << GetParam();
  std::printf("[ parity ] %s: logits max err %.3g, CE %.6f vs reference %.6f\n", GetParam(), worst, ce, ref_.ce);
}

// Exact fp32 RoPE frequencies (the default load): the logits move by the RoPE difference, the
// cross-entropy stays within the 1e-4.
TEST_P(HybridParity, ExactRopeCrossEntropy) {
  const moesq::model::ForwardOptions exact;
  EXPECT_FALSE(exact.rope_bf16_inv_freq);
  const int64_t T = ref_.T, V = model_->spec().vocab_size;
  double nll = 0.0, err = 0.0;
  for (int64_t b = 0; b < ref_.B; ++b) {
    const std::vector<float> z = model_->forward(ref_.row(b), exact);
    err = std::max(err, max_abs_diff(z.data(), &ref_.logits[b * T * V], T * V));
    nll += model_->window_nll(ref_.row(b), exact, nullptr);
  }
  EXPECT_NEAR(nll / static_cast<double>(ref_.B), ref_.ce, kCeAtol) << GetParam();
  EXPECT_GT(err, 0.0);  // the rounding is visible: the option is not a no-op
  std::printf("[ parity ] %s exact RoPE: CE %.6f vs %.6f, logits max err %.3g\n", GetParam(),
              nll / static_cast<double>(ref_.B), ref_.ce, err);
}

TEST_P(HybridParity, MixersMatchPlainLoopTwins) {
  EXPECT_LE(moesq::test::mixer_twin_error(*model_, fo_, ref_), kTwinAtol) << GetParam();
}

// Prefill 17 tokens (not a multiple of the conv kernel), then one token at a time.
TEST_P(HybridParity, DecodeEqualsFullForward) {
  EXPECT_LE(moesq::test::decode_error(*model_, fo_, ref_.row(1), 17), kDecodeAtol) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridParity, ::testing::Values("tiny-qwen3-next", "tiny-qwen3.5-moe"),
                         moesq::test::FixtureName{});

}  // namespace

// The whole forward with its trace (hidden states, router logits) and the KvDecoder over the same
// model: what `moesq eval`, `compress` and `generate` run.
namespace {

class HybridDecoderParity : public HybridParity {};

TEST_P(HybridDecoderParity, LogitsHiddenRouterAndCrossEntropy) {
  const moesq::model::DecoderModel dm(*ckpt_);
  const auto& s = dm.spec();
  EXPECT_TRUE(s.rms_norm_unit_offset);
  EXPECT_EQ(s.num_shared_experts, 1);
  const int64_t T = ref_.T, V = s.vocab_size, H = s.hidden_size, E = s.num_experts;
  moesq::model::ForwardOptions fo;
  fo.rope_bf16_inv_freq = true;  // as the references ran
  double nll = 0.0, worst = 0.0, worst_h = 0.0, worst_r = 0.0;
  for (int64_t b = 0; b < ref_.B; ++b) {
    moesq::model::Trace tr;
    const std::vector<float> z = dm.forward(ref_.row(b), fo, &tr);
    worst = std::max(worst, max_abs_diff(z.data(), &ref_.logits[b * T * V], T * V));
    for (int64_t l = 0; l <= s.num_layers; ++l)
      worst_h = std::max(worst_h, max_abs_diff(tr.hidden[l].data(), &ref_.hidden[l][b * T * H], T * H));
    for (int64_t l = 0; l < s.num_layers; ++l)
      worst_r = std::max(worst_r, max_abs_diff(tr.router_logits[l].data(), &ref_.router[l][b * T * E], T * E));
    int64_t pred = 0;
    nll += dm.window_nll(ref_.row(b), fo, &pred);
    EXPECT_EQ(pred, T - 1);
  }
  EXPECT_LE(worst, kLogitsAtol);
  EXPECT_LE(worst_h, kHiddenAtol);
  EXPECT_LE(worst_r, kHiddenAtol);
  const double ce = nll / static_cast<double>(ref_.B);
  EXPECT_NEAR(ce, ref_.ce, kCeAtol);
  std::printf("[ parity ] %s DecoderModel: logits %.3g, hidden %.3g, router %.3g, CE %.6f vs %.6f\n", GetParam(),
              worst, worst_h, worst_r, ce, ref_.ce);
}

// model::KvDecoder over the generic decoder (what data-free calibration and `generate` run): one
// token per step through each layer mixer's decode state — Gated DeltaNet's conv window + recurrent
// S, the gated attention's K/V cache — against DecoderModel::forward of the whole sequence.
TEST_P(HybridDecoderParity, KvDecoderMatchesFullForward) {
  const moesq::model::DecoderModel dm(*ckpt_);
  moesq::model::ForwardOptions fo;
  fo.rope_bf16_inv_freq = true;
  const int64_t T = ref_.T, V = dm.spec().vocab_size;
  double worst = 0.0;
  for (int64_t b = 0; b < ref_.B; ++b) {
    const std::vector<float> full = dm.forward(ref_.row(b), fo);
    moesq::model::KvDecoder dec(dm, T, fo);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> z = dec.step(ref_.row(b)[t]);
      worst = std::max(worst, max_abs_diff(z.data(), &full[t * V], V));
    }
  }
  EXPECT_LE(worst, kDecodeAtol) << GetParam();
  std::printf("[ parity ] %s KvDecoder vs DecoderModel::forward: max abs logit err %.3g\n", GetParam(), worst);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HybridDecoderParity, ::testing::Values("tiny-qwen3-next", "tiny-qwen3.5-moe"),
                         moesq::test::FixtureName{});

}  // namespace
