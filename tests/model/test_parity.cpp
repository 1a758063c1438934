// Parity of the CPU forward with transformers' float32 forward of the same bf16 checkpoint
// (tests/fixtures/tiny-reference.safetensors: 4 windows × 128 tokens of held-out text).
//
// Checked: hidden states after every layer, logits, router logits, and the top-k expert sets of all
// 512 tokens × 4 layers. The non-obvious decision: besides the free-running forward, each decoder
// layer is also run TEACHER-FORCED on the reference input of that layer, so a failure points at the
// layer that broke instead of at the accumulated drift of everything before it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "support/topk.h"

namespace {

using moesq::model::DecoderModel;

// Tolerances (absolute, on fp32 values). Both sides compute in fp32 from the same bf16 weights;
// the only differences are summation orders (OpenBLAS vs PyTorch/MKL-DNN GEMM blocking, double vs
// pairwise reductions in RMSNorm), i.e. a few fp32 ulps per op, amplified by 4 layers.
constexpr double kLogitsAtol = 1e-3;        // the parity target for the logits
constexpr double kHiddenAtol = 1e-3;        // hidden states (|h| up to ~1e2: still ~1e-5 relative)
constexpr double kRouterLogitsAtol = 1e-4;  // router logits are O(1): a few ulps of the GEMM
// Two top-k sets may legitimately differ only when the reference itself cannot separate the k-th
// and (k+1)-th expert: their router-logit gap must then be below this (≈ the router-logit error).
constexpr double kTieGap = 1e-4;

struct Reference {
  std::vector<int32_t> ids;                     // [B, T]
  std::vector<float> logits;                    // [B, T, V]
  std::vector<std::vector<float>> hidden;       // [L+1][B, T, H]
  std::vector<std::vector<float>> router;       // [L][B·T, E]
  int64_t B = 0, T = 0;
};

Reference load_reference(const moesq::io::ModelSpec& s) {
  moesq::io::SafetensorsFile f(std::string(MOESQ_FIXTURES) + "/tiny-reference.safetensors");
  Reference r;
  const auto& ids = f.get("input_ids");
  EXPECT_EQ(ids.shape.size(), 2u);
  r.B = ids.shape[0];
  r.T = ids.shape[1];
  const std::vector<float> idf = moesq::io::to_f32(ids);
  r.ids.assign(idf.begin(), idf.end());
  r.logits = moesq::io::to_f32(f.get("logits"));
  EXPECT_EQ(f.get("logits").shape, (std::vector<int64_t>{r.B, r.T, s.vocab_size}));
  for (int64_t l = 0; l <= s.num_layers; ++l)
    r.hidden.push_back(moesq::io::to_f32(f.get("hidden_states." + std::to_string(l))));
  for (int64_t l = 0; l < s.num_layers; ++l)
    r.router.push_back(moesq::io::to_f32(f.get("router_logits." + std::to_string(l))));
  return r;
}

struct MaxErr {
  double err = 0.0, ref_absmax = 0.0;
  int64_t where = -1;
  void add(const float* a, const float* b, int64_t n, int64_t offset = 0) {
    for (int64_t i = 0; i < n; ++i) {
      const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
      if (!(d <= err)) {  // NaN counts as the worst
        err = std::isnan(d) ? INFINITY : d;
        where = offset + i;
      }
      ref_absmax = std::max(ref_absmax, std::fabs(static_cast<double>(b[i])));
    }
  }
};

using moesq::test::topk_gap;
using moesq::test::topk_set;

class Parity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ckpt_ = new moesq::io::Checkpoint(MOESQ_DEFAULT_MODEL);
    model_ = new DecoderModel(*ckpt_);
    ref_ = new Reference(load_reference(model_->spec()));
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete model_;
    delete ckpt_;
  }
  static moesq::io::Checkpoint* ckpt_;
  static DecoderModel* model_;
  static Reference* ref_;
};
moesq::io::Checkpoint* Parity::ckpt_ = nullptr;
DecoderModel* Parity::model_ = nullptr;
Reference* Parity::ref_ = nullptr;

TEST_F(Parity, LoadsTheEmbeddedBf16Model) {
  const auto& s = model_->spec();
  EXPECT_EQ(s.num_layers, 4);
  EXPECT_EQ(s.num_experts, 32);
  EXPECT_FALSE(model_->default_forward_options().act_quant);  // bf16 experts → W16A16
  ASSERT_EQ(ref_->hidden.size(), static_cast<size_t>(s.num_layers + 1));
}

// Free-running forward: every window, every layer output, the logits and the routing.
TEST_F(Parity, FullForwardMatchesTransformers) {
  const auto& s = model_->spec();
  const int64_t B = ref_->B, T = ref_->T, H = s.hidden_size, V = s.vocab_size, E = s.num_experts,
                K = s.top_k, L = s.num_layers;
  std::vector<MaxErr> hid(L + 1), rl(L);
  MaxErr lg;
  int64_t mismatched = 0, ties = 0, tokens = 0;
  double min_gap = INFINITY, max_mismatch_gap = 0.0;
  double logits_absmax = 0.0;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t> ids(ref_->ids.begin() + b * T, ref_->ids.begin() + (b + 1) * T);
    moesq::model::Trace tr;
    const std::vector<float> z = model_->forward(ids, model_->default_forward_options(), &tr);
    ASSERT_EQ(z.size(), static_cast<size_t>(T * V));
    for (float v : z) logits_absmax = std::max(logits_absmax, static_cast<double>(std::fabs(v)));
    lg.add(z.data(), &ref_->logits[b * T * V], T * V, b * T * V);
    ASSERT_EQ(tr.hidden.size(), static_cast<size_t>(L + 1));
    for (int64_t l = 0; l <= L; ++l) hid[l].add(tr.hidden[l].data(), &ref_->hidden[l][b * T * H], T * H, b * T * H);
    for (int64_t l = 0; l < L; ++l) {
      rl[l].add(tr.router_logits[l].data(), &ref_->router[l][b * T * E], T * E, b * T * E);
      for (int64_t t = 0; t < T; ++t) {
        const float* zr = &ref_->router[l][(b * T + t) * E];
        std::vector<int32_t> mine(&tr.routes[l].expert[t * K], &tr.routes[l].expert[t * K] + K);
        std::sort(mine.begin(), mine.end());
        const double gap = topk_gap(zr, E, K);
        min_gap = std::min(min_gap, gap);
        if (gap < kTieGap) ++ties;
        ++tokens;
        if (mine != topk_set(zr, E, K)) {
          ++mismatched;
          max_mismatch_gap = std::max(max_mismatch_gap, gap);
        }
      }
    }
  }
  for (int64_t l = 0; l <= L; ++l) {
    std::printf("hidden_states.%lld  max abs err %.3g  (max |ref| %.3g)\n", static_cast<long long>(l),
                hid[l].err, hid[l].ref_absmax);
    EXPECT_LE(hid[l].err, kHiddenAtol) << "hidden_states." << l << " first worst flat index " << hid[l].where;
  }
  for (int64_t l = 0; l < L; ++l) {
    std::printf("router_logits.%lld  max abs err %.3g\n", static_cast<long long>(l), rl[l].err);
    EXPECT_LE(rl[l].err, kRouterLogitsAtol) << "router_logits." << l << " flat index " << rl[l].where;
  }
  std::printf("logits            max abs err %.3g  (max |ref| %.3g)\n", lg.err, lg.ref_absmax);
  std::printf("top-k sets: %lld/%lld tokens×layers differ; reference gaps < %.0e: %lld; smallest "
              "reference k-th/(k+1)-th router-logit gap %.3g\n",
              static_cast<long long>(mismatched), static_cast<long long>(tokens), kTieGap,
              static_cast<long long>(ties), min_gap);
  EXPECT_LE(lg.err, kLogitsAtol) << "logits flat index " << lg.where;
  EXPECT_GT(logits_absmax, 1.0) << "logits are (nearly) all zero";
  EXPECT_EQ(tokens, B * T * L);
  // Any differing top-k set must be an exact-tie account: the reference cannot separate it.
  if (mismatched > 0)
    EXPECT_LT(max_mismatch_gap, kTieGap) << mismatched << " top-k sets differ with reference gap up to "
                                         << max_mismatch_gap;
}

// Each decoder layer alone, fed the reference input of that layer.
TEST_F(Parity, EachLayerTeacherForced) {
  const auto& s = model_->spec();
  const int64_t B = ref_->B, T = ref_->T, H = s.hidden_size, L = s.num_layers;
  for (int64_t l = 0; l + 1 < L; ++l) {  // the last reference state is after the final norm
    MaxErr e;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<float> h(&ref_->hidden[l][b * T * H], &ref_->hidden[l][(b + 1) * T * H]);
      model_->attention_block(l, h, T, {});
      const std::vector<float> x = model_->moe_input(l, h, T);
      const auto r = model_->route(l, x, T);
      const std::vector<float> y = model_->moe_block(l, x, r, {});
      for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
      e.add(h.data(), &ref_->hidden[l + 1][b * T * H], T * H);
    }
    std::printf("layer %lld teacher-forced: max abs err %.3g\n", static_cast<long long>(l), e.err);
    EXPECT_LE(e.err, kHiddenAtol) << "layer " << l;
  }
}

// The embedding output is a pure lookup of bf16 values: it must match bit for bit.
TEST_F(Parity, EmbeddingIsExact) {
  const int64_t T = ref_->T, H = model_->spec().hidden_size;
  const std::vector<int32_t> ids(ref_->ids.begin(), ref_->ids.begin() + T);
  const std::vector<float> h = model_->embed(ids);
  for (int64_t i = 0; i < T * H; ++i) ASSERT_EQ(h[i], ref_->hidden[0][i]) << "index " << i;
}

// Thread count must not change a single bit (the combine order is fixed by expert id).
TEST_F(Parity, ForwardIsBitwiseIndependentOfThreads) {
  const int64_t T = ref_->T;
  const std::vector<int32_t> ids(ref_->ids.begin() + T, ref_->ids.begin() + 2 * T);
  moesq::model::ForwardOptions one, many;
  one.threads = 1;
  many.threads = 4;
  const auto a = model_->forward(ids, one), b = model_->forward(ids, many);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "index " << i;
}

}  // namespace
