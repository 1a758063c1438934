// Parity of the DeepSeek-V3 family's CPU forward with transformers 5.17's float32 forward of the
// same bf16 checkpoint (tests/fixtures/tiny-deepseek-v3-reference: 2 random sequences × 64 tokens,
// copied from ../shared/models). hidden_states.i is the input of layer i, hidden_states.L the last
// layer's output after the final norm; summary.json holds the reference cross-entropy.
//
// Each decoder layer is run TEACHER-FORCED on the reference input of that layer (a failure names the
// layer), then the whole model free-running through a decoder loop written here (embed → [MLA →
// FFN] × L → norm → lm_head): the generic decoder of the family framework replaces this loop when
// the family is registered there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/families/deepseek_v3.h"
#include "support/temp_dir.h"

namespace {

using moesq::model::DeepseekV3;

const std::string kModelDir = std::string(MOESQ_FIXTURES) + "/tiny-deepseek-v3";
const std::string kRefDir = std::string(MOESQ_FIXTURES) + "/tiny-deepseek-v3-reference";

// Both sides compute in fp32 from the same bf16 weights; only summation orders differ (OpenBLAS vs
// PyTorch GEMM blocking, double vs pairwise RMSNorm sums): a few fp32 ulps per op over 3 layers.
constexpr double kHiddenAtol = 1e-3;  // issue 16: hidden states and logits within 1e-3
constexpr double kLogitsAtol = 1e-3;
constexpr double kCeAtol = 1e-4;  // issue 16: nats/token vs summary.json
// fast vs _ref twins of a whole layer on the real weights (summation order only).
constexpr double kTwinAtol = 1e-4;

struct Reference {
  std::vector<int32_t> ids;                // [B, T]
  std::vector<float> logits;               // [B, T, V]
  std::vector<std::vector<float>> hidden;  // [L+1][B, T, H]
  int64_t B = 0, T = 0;
  double ce = 0;
};

struct MaxErr {
  double err = 0, ref_absmax = 0;
  int64_t where = -1;
  void add(const float* a, const float* b, int64_t n, int64_t offset = 0) {
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
      if (!(d <= err)) {
        err = std::isnan(d) ? INFINITY : d;
        where = offset + i;
      }
      ref_absmax = std::max(ref_absmax, std::fabs(static_cast<double>(b[i])));
    }
  }
};

class DeepseekV3Parity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ckpt_ = new moesq::io::Checkpoint(kModelDir);
    model_ = new DeepseekV3(*ckpt_);
    ref_ = new Reference;
    moesq::io::SafetensorsFile f(kRefDir + "/reference.safetensors");
    const auto& ids = f.get("input_ids");
    ref_->B = ids.shape.at(0);
    ref_->T = ids.shape.at(1);
    for (float v : moesq::io::to_f32(ids)) ref_->ids.push_back(static_cast<int32_t>(v));
    ref_->logits = moesq::io::to_f32(f.get("logits"));
    for (int64_t l = 0; l <= model_->spec().num_layers; ++l)
      ref_->hidden.push_back(moesq::io::to_f32(f.get("hidden_states." + std::to_string(l))));
    std::ifstream in(kRefDir + "/summary.json");
    ref_->ce = nlohmann::json::parse(in).at("ce").get<double>();
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete model_;
    delete ckpt_;
  }
  std::vector<int32_t> window(int64_t b) const {
    return {ref_->ids.begin() + b * ref_->T, ref_->ids.begin() + (b + 1) * ref_->T};
  }
  const float* hidden(int64_t l, int64_t b) const {
    return &ref_->hidden[l][b * ref_->T * model_->spec().hidden_size];
  }
  static moesq::io::Checkpoint* ckpt_;
  static DeepseekV3* model_;
  static Reference* ref_;
};
moesq::io::Checkpoint* DeepseekV3Parity::ckpt_ = nullptr;
DeepseekV3* DeepseekV3Parity::model_ = nullptr;
Reference* DeepseekV3Parity::ref_ = nullptr;

// The decoder loop (what the family framework's generic decoder does for this family).
// tokens [T] → logits [T, V]; hidden (optional) receives [L+1][T, H] like the reference.
std::vector<float> forward(const DeepseekV3& m, const std::vector<int32_t>& tokens,
                           std::vector<std::vector<float>>* hidden = nullptr) {
  const int64_t T = static_cast<int64_t>(tokens.size()), L = m.spec().num_layers;
  const moesq::model::RopeTables rope = m.rope_tables(T);
  std::vector<float> h = m.embed(tokens);
  if (hidden) hidden->assign(1, h);
  for (int64_t l = 0; l < L; ++l) {
    m.attention_block(l, h, T, rope, {});
    m.ffn_block(l, h, T, {});
    if (hidden) hidden->push_back(l + 1 < L ? h : m.final_norm(h, T));
  }
  return m.logits(h, T);
}

TEST_F(DeepseekV3Parity, LoadsTheFixture) {
  const auto& s = model_->spec();
  EXPECT_EQ(s.num_layers, 3);
  EXPECT_EQ(ckpt_->spec().model_type, "deepseek_v3");
  ASSERT_EQ(ref_->hidden.size(), 4u);
  EXPECT_EQ(ref_->B * ref_->T * s.vocab_size, static_cast<int64_t>(ref_->logits.size()));
  // Layer 0 is dense, layers 1-2 are MoE with a router bias and a shared expert, all non-zero.
  EXPECT_FALSE(model_->layer(0).dense_mlp.gate.empty());
  EXPECT_TRUE(model_->layer(0).experts.empty());
  for (int64_t l : {1, 2}) {
    const auto& L = model_->layer(l);
    ASSERT_EQ(L.experts.size(), 16u);
    EXPECT_EQ(L.shared.gate.size(), static_cast<size_t>(64 * 128));
    EXPECT_TRUE(std::any_of(L.correction_bias.begin(), L.correction_bias.end(), [](float v) { return v != 0; }));
  }
}

TEST_F(DeepseekV3Parity, EachLayerTeacherForced) {
  const auto& s = model_->spec();
  const int64_t B = ref_->B, T = ref_->T, H = s.hidden_size, L = s.num_layers;
  const auto rope = model_->rope_tables(T);
  for (int64_t l = 0; l < L; ++l) {
    MaxErr e, twin;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<float> h(hidden(l, b), hidden(l, b) + T * H), h_ref = h;
      model_->attention_block(l, h, T, rope, {});
      model_->attention_block_ref(l, h_ref, T, rope);
      twin.add(h.data(), h_ref.data(), T * H);
      model_->ffn_block(l, h, T, {});
      const std::vector<float> out = l + 1 < L ? h : model_->final_norm(h, T);
      e.add(out.data(), hidden(l + 1, b), T * H, b * T * H);
    }
    std::printf("layer %lld teacher-forced: max abs err %.3g (max |ref| %.3g); attention fast vs ref %.3g\n",
                static_cast<long long>(l), e.err, e.ref_absmax, twin.err);
    EXPECT_LE(e.err, kHiddenAtol) << "layer " << l << " flat index " << e.where;
    EXPECT_LE(twin.err, kTwinAtol) << "layer " << l << " attention fast vs ref";
    EXPECT_GT(e.ref_absmax, 0.1) << "reference hidden state " << l + 1 << " is (nearly) all zero";
  }
}

// The MoE layers' fast routing and expert stage against their twins on the real weights: identical
// routes, outputs to summation order.
TEST_F(DeepseekV3Parity, MoeTwinsAgreeOnTheFixture) {
  const auto& s = model_->spec();
  const int64_t T = ref_->T, H = s.hidden_size;
  for (int64_t l = 1; l < s.num_layers; ++l) {
    const std::vector<float> h(hidden(l, 0), hidden(l, 0) + T * H);
    const auto x = model_->moe_input(l, h, T);
    const auto r = model_->route(l, x, T), rr = model_->route_ref(l, x, T);
    EXPECT_EQ(r.expert, rr.expert) << "layer " << l;
    MaxErr w;
    w.add(r.weight.data(), rr.weight.data(), static_cast<int64_t>(r.weight.size()));
    EXPECT_LE(w.err, 1e-6) << "layer " << l << " route weights";
    const auto y = model_->moe_block(l, x, r, {}), yr = model_->moe_block_ref(l, x, r, {});
    MaxErr e;
    e.add(y.data(), yr.data(), T * H);
    EXPECT_LE(e.err, kTwinAtol) << "layer " << l << " moe_block fast vs ref";
    EXPECT_GT(e.ref_absmax, 1e-3);
  }
}

TEST_F(DeepseekV3Parity, FullForwardLogitsAndCrossEntropy) {
  const auto& s = model_->spec();
  const int64_t B = ref_->B, T = ref_->T, H = s.hidden_size, V = s.vocab_size, L = s.num_layers;
  MaxErr lg;
  std::vector<MaxErr> hid(L + 1);
  double nll = 0;
  int64_t predicted = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<std::vector<float>> tr;
    const std::vector<int32_t> ids = window(b);
    const std::vector<float> z = forward(*model_, ids, &tr);
    ASSERT_EQ(z.size(), static_cast<size_t>(T * V));
    lg.add(z.data(), &ref_->logits[b * T * V], T * V, b * T * V);
    for (int64_t l = 0; l <= L; ++l) hid[l].add(tr[l].data(), hidden(l, b), T * H, b * T * H);
    for (int64_t t = 0; t + 1 < T; ++t) {  // mean over predicted tokens, as transformers' loss
      const float* zt = &z[t * V];
      const double mx = *std::max_element(zt, zt + V);
      double se = 0;
      for (int64_t v = 0; v < V; ++v) se += std::exp(static_cast<double>(zt[v]) - mx);
      nll += mx + std::log(se) - zt[ids[t + 1]];
      ++predicted;
    }
  }
  for (int64_t l = 0; l <= L; ++l) {
    std::printf("hidden_states.%lld  max abs err %.3g (max |ref| %.3g)\n", static_cast<long long>(l), hid[l].err,
                hid[l].ref_absmax);
    EXPECT_LE(hid[l].err, kHiddenAtol) << "hidden_states." << l << " flat index " << hid[l].where;
  }
  const double ce = nll / static_cast<double>(predicted);
  std::printf("logits max abs err %.3g (max |ref| %.3g); cross-entropy %.7f vs summary.json %.7f (|diff| %.2g)\n",
              lg.err, lg.ref_absmax, ce, ref_->ce, std::fabs(ce - ref_->ce));
  EXPECT_LE(lg.err, kLogitsAtol) << "logits flat index " << lg.where;
  EXPECT_GT(lg.ref_absmax, 0.1) << "reference logits are (nearly) all zero";
  EXPECT_LE(std::fabs(ce - ref_->ce), kCeAtol);
}

// A checkpoint whose tensors do not fit its config: the error names the tensor, its shape and the
// expected one. (kv_lora_rank 16 in the config, 32 in the files.)
TEST(DeepseekV3Load, ShapeMismatchNamesTheTensor) {
  moesq::test::TempDir dir("moesq_dsv3");
  namespace fs = std::filesystem;
  for (const auto& f : fs::directory_iterator(kModelDir)) fs::copy_file(f.path(), dir.path / f.path().filename());
  std::ifstream in(kModelDir + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["kv_lora_rank"] = 16;
  fs::remove(dir.file("config.json"));
  dir.write("config.json", cfg.dump());
  const moesq::io::Checkpoint ckpt(dir.path.string());
  try {
    DeepseekV3 m(ckpt);
    ADD_FAILURE() << "no error";
  } catch (const moesq::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[48, 128]"), std::string::npos) << msg;
  }
}

}  // namespace
