// Parity of gpt-oss in the generic decoder (model::DecoderModel: mixers/sink_attention, the
// TopkSoftmax router with its logit bias, biased clamped-SwiGLU experts unpacked from the fused
// tensors) with transformers' float32 forward of the tiny-gpt-oss fixture (../shared/models/README.md).
//
// Checked: the config and layout as loaded; each layer teacher-forced on the reference input
// (hidden_states.l → .l+1, the last after the final norm) with its router logits and top-k sets;
// free-running logits and the cross-entropy of summary.json, with the reference's bf16-rounded RoPE
// frequencies and with exact fp32 ones (what `moesq eval` runs); the mixer and the experts against
// their plain-loop twins on the fixture's weights. tests/model/test_family_parity.cpp and
// tests/cli/test_families.cpp run the generic family checks (and eval / compress) on it too.
// The fixture's 64-token windows never exceed its sliding_window of 64, so the window itself is
// checked in test_family_mixers.cpp on longer sequences, and KvDecoderAppliesTheSlidingWindow runs
// the KV-cached decoder past the window on the fixture's own weights.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/config_hybrid.h"
#include "io/tensor_names.h"
#include "io/tensor_names_families.h"
#include "model/decoder.h"
#include "model/mixers/family_load.h"
#include "model/kv_decoder.h"
#include "model/mixers/gated_attention.h"
#include "model/tensor_math.h"
#include "support/family_reference.h"
#include "support/temp_dir.h"

namespace {

using moesq::model::DecoderModel;
using moesq::test::max_abs_diff;

// Both sides compute in fp32 from the same bf16 weights; only summation orders differ.
constexpr double kHiddenAtol = 1e-3;
constexpr double kLogitsAtol = 1e-3;
constexpr double kRouterLogitsAtol = 1e-4;
constexpr double kTieGap = 1e-4;  // top-k sets must agree where the reference's k-th/(k+1)-th gap exceeds this
constexpr double kCeAtol = 1e-4;  // the family bar for eval against summary.json
constexpr double kTwinAtol = 2e-5;  // fast path vs plain-loop twin (GEMM summation order)
constexpr const char* kFixture = "tiny-gpt-oss";

moesq::model::ForwardOptions reference_options(bool bf16_rope) {
  moesq::model::ForwardOptions fo;
  fo.rope_bf16_inv_freq = bf16_rope;  // how the reference ran (transformers in bf16, upcast)
  return fo;
}

class GptOssParity : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = moesq::test::shared_models_dir(kFixture) + "/" + kFixture;
    if (!std::filesystem::is_directory(dir_)) GTEST_SKIP() << "fixture " << dir_ << " not present";
    ckpt_ = std::make_unique<moesq::io::Checkpoint>(dir_);
    model_ = std::make_unique<DecoderModel>(*ckpt_);
    ref_ = moesq::test::load_family_reference(kFixture, model_->spec().num_layers);
  }
  std::string dir_;
  std::unique_ptr<moesq::io::Checkpoint> ckpt_;
  std::unique_ptr<DecoderModel> model_;
  moesq::test::FamilyReference ref_;
};

TEST_F(GptOssParity, ConfigAndLayout) {
  const moesq::io::ModelSpec& s = model_->spec();
  EXPECT_EQ(s.model_type, "gpt_oss");
  EXPECT_EQ(s.router_scoring, moesq::io::RouterScoring::TopkSoftmax);
  EXPECT_TRUE(s.router_logit_bias && s.expert_bias && s.clamped_swiglu && s.attention_bias);
  EXPECT_DOUBLE_EQ(s.swiglu_limit, 7.0);
  EXPECT_EQ(s.moe_intermediate_size, 64);
  EXPECT_EQ(s.num_experts, 8);
  const moesq::io::FamilySpec f = moesq::io::parse_family_config(ckpt_->config(), dir_);
  EXPECT_EQ(f.layer_mixer[0], moesq::io::MixerKind::SlidingAttention);
  EXPECT_EQ(f.layer_mixer[1], moesq::io::MixerKind::FullAttention);
  EXPECT_EQ(f.sliding_window, 64);
  EXPECT_EQ(f.rope.type, moesq::io::HybridRopeType::Yarn);
  EXPECT_NEAR(f.rope.attention_factor, 0.1 * std::log(32.0) + 1.0, 1e-12);
  EXPECT_FALSE(f.rope.truncate);
  ASSERT_TRUE(model_->layer(0).mixer && model_->layer(1).mixer);
  EXPECT_EQ(model_->layer(0).mixer->name(), "sliding_sink_attention");
  EXPECT_EQ(model_->layer(1).mixer->name(), "sink_attention");
  const auto& L = model_->layer(0);
  EXPECT_EQ(L.router_logit_bias.size(), 8u);
  ASSERT_EQ(L.experts.size(), 8u);
  EXPECT_EQ(L.experts[3].gate_bias.size(), 64u);
  EXPECT_EQ(L.experts[3].down_bias.size(), 128u);
  // The fused source layout, read from the checkpoint itself: gate_up [E, H, 2I] (gate even, up odd
  // columns), down [E, I, H]; the loaded experts are their Linear-layout transposes.
  const std::string gu = moesq::io::layer_tensor(0, "mlp.experts.gate_up_proj");
  const std::string dn = moesq::io::layer_tensor(0, "mlp.experts.down_proj");
  EXPECT_EQ(ckpt_->get(gu).shape, (std::vector<int64_t>{8, 128, 128}));
  EXPECT_EQ(ckpt_->get(dn).shape, (std::vector<int64_t>{8, 64, 128}));
  const std::vector<float> gu_w = ckpt_->get_f32(gu, {8, 128, 128}), dn_w = ckpt_->get_f32(dn, {8, 64, 128});
  for (int64_t e : {0, 5})
    for (int64_t i : {0, 17, 63})
      for (int64_t c : {0, 99}) {
        EXPECT_EQ(L.experts[e].gate[i * 128 + c], gu_w[(e * 128 + c) * 128 + 2 * i]);
        EXPECT_EQ(L.experts[e].up[i * 128 + c], gu_w[(e * 128 + c) * 128 + 2 * i + 1]);
        EXPECT_EQ(L.experts[e].down[c * 64 + i], dn_w[(e * 64 + i) * 128 + c]);
      }
  EXPECT_TRUE(moesq::io::is_expert_tensor(gu) && moesq::io::is_expert_tensor(dn));
  EXPECT_EQ(moesq::io::tensor_role(s, gu + "_bias"), moesq::io::TensorRole::ExpertBias);
  EXPECT_EQ(moesq::io::tensor_role(s, moesq::io::layer_tensor(0, "mlp.router.weight")), moesq::io::TensorRole::Router);
  EXPECT_EQ(moesq::io::tensor_role(s, moesq::io::layer_tensor(0, "mlp.router.bias")),
            moesq::io::TensorRole::RouterBias);
}

TEST_F(GptOssParity, LayersTeacherForced) {
  const auto& s = model_->spec();
  const int64_t T = ref_.T, H = s.hidden_size, E = s.num_experts, L = s.num_layers;
  const auto fo = reference_options(true);
  double hidden = 0, router = 0, min_peak = 1e30;
  int64_t topk_bad = 0, ties = 0;
  for (int64_t b = 0; b < ref_.B; ++b)
    for (int64_t l = 0; l < L; ++l) {
      std::vector<float> h(&ref_.hidden[l][b * T * H], &ref_.hidden[l][(b + 1) * T * H]);
      model_->attention_block(l, h, T, fo);
      const std::vector<float> x = model_->moe_input(l, h, T);
      moesq::model::Routes r;
      const std::vector<float> y = model_->ffn_block(l, x, T, fo, &r);
      for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
      std::vector<float> out = h;
      if (l + 1 == L) {  // the last reference state is after the final norm
        out.assign(T * H, 0.0f);
        moesq::model::rmsnorm_rows(h.data(), T, H, model_->final_norm_weight().data(), s.rms_norm_eps, out.data());
      }
      hidden = std::max(hidden, max_abs_diff(out.data(), &ref_.hidden[l + 1][b * T * H], T * H));
      min_peak = std::min(min_peak, moesq::test::max_abs(out));
      ASSERT_FALSE(ref_.router[l].empty());
      router = std::max(router, max_abs_diff(r.logits.data(), &ref_.router[l][b * T * E], T * E));
      topk_bad += moesq::test::topk_mismatches(r.expert, r.k, &ref_.router[l][b * T * E], T, E, kTieGap, &ties);
    }
  std::printf("[ parity ] %s teacher-forced (DecoderModel): hidden max err %.3g, router logits %.3g, near-ties %ld\n",
              kFixture, hidden, router, static_cast<long>(ties));
  EXPECT_LE(hidden, kHiddenAtol);
  EXPECT_LE(router, kRouterLogitsAtol);
  EXPECT_EQ(topk_bad, 0);
  EXPECT_LE(ties, 4);
  EXPECT_GT(min_peak, 0.01);
}

TEST_F(GptOssParity, LogitsAndCrossEntropy) {
  const int64_t T = ref_.T, V = model_->spec().vocab_size;
  for (bool bf16_rope : {true, false}) {
    const auto fo = reference_options(bf16_rope);
    double nll = 0.0, worst = 0.0;
    for (int64_t b = 0; b < ref_.B; ++b) {
      const std::vector<float> z = model_->forward(ref_.row(b), fo);
      worst = std::max(worst, max_abs_diff(z.data(), &ref_.logits[b * T * V], T * V));
      int64_t predicted = 0;
      nll += model_->window_nll(ref_.row(b), fo, &predicted);
      EXPECT_EQ(predicted, T - 1);
    }
    const double ce = nll / static_cast<double>(ref_.B);
    std::printf("[ parity ] %s (%s RoPE): logits max err %.3g, CE %.7f vs reference %.7f (%+.2g)\n", kFixture,
                bf16_rope ? "bf16" : "exact fp32", worst, ce, ref_.ce, ce - ref_.ce);
    EXPECT_LE(worst, kLogitsAtol) << (bf16_rope ? "bf16" : "exact") << " RoPE";
    EXPECT_NEAR(ce, ref_.ce, kCeAtol) << (bf16_rope ? "bf16" : "exact") << " RoPE";
  }
}

// The sink / sliding-window attention (as the mixer factory loads it) and every expert, fast path vs
// plain-loop twin on the reference's layer inputs; the mixer gives the fast path's output.
TEST_F(GptOssParity, MixerAndExpertsMatchPlainLoopTwins) {
  const auto& s = model_->spec();
  const int64_t T = ref_.T, H = s.hidden_size;
  const moesq::io::FamilySpec f = moesq::io::parse_family_config(ckpt_->config(), dir_);
  for (int64_t l = 0; l < s.num_layers; ++l) {
    std::vector<float> x(T * H);
    moesq::model::rmsnorm_rows(&ref_.hidden[l][0], T, H, model_->layer(l).input_norm.data(), s.rms_norm_eps, x.data());
    moesq::model::AttentionWeights w;
    moesq::model::family_load::load_attention_projections(*ckpt_, f, l, w);
    w.sinks = moesq::model::family_load::layer_f32(*ckpt_, l, moesq::io::family_names::kSinks, {s.num_heads});
    const moesq::model::AttentionShape a = moesq::model::family_attention_shape(f, l);
    std::vector<float> y(T * H), y_ref(T * H);
    moesq::model::attention_forward(a, w, x.data(), T, y.data());
    moesq::model::attention_forward_ref(a, w, x.data(), T, y_ref.data());
    const std::vector<float> y_mixer = model_->layer(l).mixer->forward(x.data(), T, {});
    EXPECT_LE(max_abs_diff(y.data(), y_ref.data(), T * H), kTwinAtol) << "layer " << l;
    EXPECT_EQ(y_mixer, y) << "layer " << l << ": the mixer is not the sink attention";
    EXPECT_GT(moesq::test::max_abs(y), 1e-3);
    // Expert inputs: the post-attention norm of the first sequence's layer input (O(1) rows, not zeros).
    const std::vector<float> h0(&ref_.hidden[l][0], &ref_.hidden[l][0] + T * H);
    const std::vector<float> xm = model_->moe_input(l, h0, T);
    for (int64_t e = 0; e < s.num_experts; ++e) {
      moesq::model::ForwardOptions fo;
      const std::vector<float> ye = model_->expert_forward(l, e, xm.data(), T, fo);
      const std::vector<float> ye_ref = model_->expert_forward_ref(l, e, xm.data(), T, fo);
      EXPECT_LE(max_abs_diff(ye.data(), ye_ref.data(), T * H), kTwinAtol) << "layer " << l << " expert " << e;
      EXPECT_GT(moesq::test::max_abs(ye), 1e-3) << "layer " << l << " expert " << e;
    }
  }
}

// KV-cached decode (model::KvDecoder: the sink attention's K/V cache, one token per step) against the
// full forward on sequences LONGER than sliding_window, so the window layers drop keys on both paths
// (the reference's 64 tokens never reach the window of 64): window + 20 tokens, and 2·window + 20,
// past the point where the decode state drops the keys no later query sees (drop_invisible_keys).
// That the window really acts is checked on layer 0's mixer: its output equals the same attention
// without a window on the first sliding_window rows and differs after them; its own decode steps
// give the forward's rows; a cache missing a visible key is refused.
TEST_F(GptOssParity, KvDecoderAppliesTheSlidingWindow) {
  const auto& s = model_->spec();
  const moesq::io::FamilySpec f = moesq::io::parse_family_config(ckpt_->config(), dir_);
  const int64_t W = f.sliding_window, H = s.hidden_size, V = s.vocab_size;
  ASSERT_GT(W, 0);
  ASSERT_EQ(f.layer_mixer.at(0), moesq::io::MixerKind::SlidingAttention) << "the fixture's layer 0 has no window";
  std::mt19937 rng(20261201);
  const moesq::model::ForwardOptions fo = reference_options(/*bf16_rope=*/false);

  // Same math, matvec vs sgemm summation order: the family parity bound (measured: see the printout).
  constexpr double kDecodeAtol = 1e-4;
  for (const int64_t T : {W + 20, 2 * W + 20}) {
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
    std::vector<int32_t> ids(T);
    for (int32_t& id : ids) id = tok(rng);
    const std::vector<float> full = model_->forward(ids, fo);
    moesq::model::KvDecoder dec(*model_, T, fo);
    double e = 0, e_past = 0;  // all steps; steps at positions >= W (where the window drops keys)
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> z = dec.step(ids[t]);
      const double d = max_abs_diff(z.data(), &full[t * V], V);
      e = std::max(e, d);
      if (t >= W) e_past = std::max(e_past, d);
    }
    std::printf("gpt-oss decode vs full forward, T = %lld (window %lld): max abs logit err %.3g "
                "(positions >= window: %.3g)\n",
                static_cast<long long>(T), static_cast<long long>(W), e, e_past);
    EXPECT_LE(e, kDecodeAtol) << "T = " << T;
    EXPECT_GT(moesq::test::max_abs(full), 0.1) << "logits are (nearly) all zero";
  }

  // Layer 0's mixer on random unit-scale rows: windowed vs unwindowed, forward vs its decode steps.
  const int64_t T = 2 * W + 20;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(T * H);
  for (float& v : x) v = nd(rng);
  const moesq::model::Mixer& mx = *model_->layer(0).mixer;
  const std::vector<float> y_win = mx.forward(x.data(), T, fo);
  moesq::model::AttentionWeights w;
  moesq::model::family_load::load_attention_projections(*ckpt_, f, 0, w);
  w.sinks = moesq::model::family_load::layer_f32(*ckpt_, 0, moesq::io::family_names::kSinks, {s.num_heads});
  const moesq::model::AttentionShape a = moesq::model::family_attention_shape(f, 0);
  ASSERT_EQ(a.window, W);
  moesq::model::AttentionShape no_window = a;
  no_window.window = 0;
  std::vector<float> y_full(T * H);
  moesq::model::attention_forward(no_window, w, x.data(), T, y_full.data());
  EXPECT_LE(max_abs_diff(y_win.data(), y_full.data(), W * H), kTwinAtol) << "rows inside the window";
  EXPECT_GT(max_abs_diff(&y_win[W * H], &y_full[W * H], (T - W) * H), 1e-3) << "the window dropped no key";
  std::unique_ptr<moesq::model::MixerState> st = mx.new_decode_state(T, fo);
  ASSERT_TRUE(st) << mx.name() << " has no decode state";
  double e_mix = 0;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> y = mx.decode(&x[t * H], 1, *st, fo);
    e_mix = std::max(e_mix, max_abs_diff(y.data(), &y_win[t * H], H));
  }
  std::printf("gpt-oss layer 0 (%s) decode vs forward, T = %lld: max abs err %.3g\n", mx.name().c_str(),
              static_cast<long long>(T), e_mix);
  EXPECT_LE(e_mix, kTwinAtol);
  EXPECT_EQ(st->pos, T);
  EXPECT_THROW(mx.decode(x.data(), 1, *st, fo), moesq::Error) << "a step past max_len must be refused";

  // The cache after T steps holds < 2·W rows; one dropped row too many is refused, not misread.
  moesq::model::KvCache kv;
  std::vector<float> y(T * H);
  moesq::model::attention_forward(a, w, x.data(), T, y.data(), &kv);
  moesq::model::drop_invisible_keys(a, kv);
  const int64_t kw = s.num_kv_heads * s.head_dim;
  EXPECT_EQ(kv.first, T - W + 1);
  EXPECT_EQ(static_cast<int64_t>(kv.k.size()), (W - 1) * kw);
  kv.k.erase(kv.k.begin(), kv.k.begin() + kw);
  kv.v.erase(kv.v.begin(), kv.v.begin() + kw);
  ++kv.first;
  EXPECT_THROW(moesq::model::attention_forward(a, w, x.data(), 1, y.data(), &kv), moesq::Error);
}

// Bad input: a checkpoint missing a fused expert tensor (and its per-expert replacement), or with a
// fused tensor of the wrong shape, is an Error naming the tensor, not a wrong forward.
TEST_F(GptOssParity, MissingOrMisshapenFusedTensorsAreNamed) {
  const std::string down = moesq::io::layer_tensor(1, "mlp.experts.down_proj");
  const std::string gu_bias = moesq::io::layer_tensor(0, "mlp.experts.gate_up_proj_bias");
  for (const std::string& broken : {down, gu_bias}) {
    for (bool drop : {true, false}) {
      moesq::test::TempDir dir("moesq_gpt_oss_bad");
      moesq::io::SafetensorsWriter w;
      std::vector<float> wrong;  // a [1, 2] f32 stand-in for the misshapen case
      for (const std::string& n : ckpt_->names()) {
        const moesq::io::TensorView& t = ckpt_->get(n);
        if (n != broken) {
          w.add(n, t.dtype, t.shape, t.data, t.nbytes);
        } else if (!drop) {
          wrong.assign(2, 1.0f);
          w.add(n, moesq::io::DType::F32, {1, 2}, wrong.data(), wrong.size() * sizeof(float));
        }
      }
      moesq::io::write_checkpoint_tensors(dir.path.string(), w);
      std::filesystem::copy_file(dir_ + "/config.json", dir.file("config.json"));
      const moesq::io::Checkpoint bad(dir.path.string());
      try {
        const DecoderModel m(bad);
        ADD_FAILURE() << broken << (drop ? " missing" : " misshapen") << ": loaded without an error";
      } catch (const moesq::Error& e) {
        EXPECT_NE(std::string(e.what()).find(broken), std::string::npos)
            << (drop ? "missing: " : "misshapen: ") << e.what();
      }
    }
  }
}

}  // namespace
