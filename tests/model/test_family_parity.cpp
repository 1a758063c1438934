// Parity of the generic CPU decoder with transformers' float32 forward for each non-Qwen3 family
// fixture (tests/fixtures/families/tiny-ARCH and tiny-ARCH-reference, copies of
// ../shared/models: random bf16 weights, two 64-token sequences).
//
// Checked per family: hidden states after every layer, logits, router logits of every MoE layer, the
// top-k expert sets (identical wherever the reference's k-th/(k+1)-th logit gap exceeds kTieGap), each
// layer teacher-forced on the reference input of that layer (so a failure names the layer), and the
// mean next-token cross-entropy against summary.json's "ce".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "support/topk.h"
#include "model/decoder.h"
#include "model/kv_decoder.h"

namespace {

using moesq::model::DecoderModel;

// Tolerances (absolute, fp32). Both sides compute in fp32 from the same bf16 weights; only summation
// orders differ (OpenBLAS vs PyTorch GEMM blocking, double vs pairwise RMSNorm sums).
constexpr double kLogitsAtol = 1e-3;        // the family bar (fp32 summation order only)
constexpr double kHiddenAtol = 1e-3;        // hidden states (O(1)–O(10) values)
constexpr double kRouterLogitsAtol = 1e-3;  // router logits
// A top-k set may differ only where the reference cannot separate the k-th and (k+1)-th expert.
constexpr double kTieGap = 1e-3;
// `moesq eval`'s bar against summary.json's cross-entropy (nats/token).
constexpr double kCeAtol = 1e-4;

// How the references were made: transformers loaded each bf16 checkpoint in bf16 and upcast it with
// .float(), so its RoPE inv_freq buffer holds bf16-rounded frequencies. The fixtures' forward runs the
// same way (ForwardOptions::rope_bf16_inv_freq). Measured on tiny-olmoe layer 0 (q/k RMSNorm makes its
// scores sensitive): router-logit error 6.6e-4 with fp32 frequencies, 4.5e-7 with bf16 ones (double-
// precision check); qwen2-moe and mixtral pass either way.
moesq::model::ForwardOptions reference_options() {
  moesq::model::ForwardOptions fo;
  fo.rope_bf16_inv_freq = true;
  return fo;
}

std::string fixture(const std::string& name) { return std::string(MOESQ_FIXTURES) + "/families/" + name; }

struct Reference {
  std::vector<int32_t> ids;                // [B, T]
  std::vector<float> logits;               // [B, T, V]
  std::vector<std::vector<float>> hidden;  // [L+1][B, T, H]
  std::vector<std::vector<float>> router;  // [MoE layers][B·T, E], in layer order
  int64_t B = 0, T = 0;
  double ce = 0;
};

Reference load_reference(const std::string& arch, const moesq::io::ModelSpec& s) {
  const std::string dir = fixture("tiny-" + arch + "-reference");
  moesq::io::SafetensorsFile f(dir + "/reference.safetensors");
  Reference r;
  const auto& ids = f.get("input_ids");
  r.B = ids.shape.at(0);
  r.T = ids.shape.at(1);
  const std::vector<float> idf = moesq::io::to_f32(ids);
  r.ids.assign(idf.begin(), idf.end());
  r.logits = moesq::io::to_f32(f.get("logits"));
  for (int64_t l = 0; l <= s.num_layers; ++l)
    r.hidden.push_back(moesq::io::to_f32(f.get("hidden_states." + std::to_string(l))));
  int64_t moe = 0;
  for (int64_t l = 0; l < s.num_layers; ++l) moe += s.is_moe_layer(l);
  // Router logits where the reference reports them (tiny-deepseek-v3's does not).
  for (int64_t i = 0; i < moe && f.has("router_logits." + std::to_string(i)); ++i)
    r.router.push_back(moesq::io::to_f32(f.get("router_logits." + std::to_string(i))));
  std::ifstream js(dir + "/summary.json");
  r.ce = nlohmann::json::parse(js).at("ce").get<double>();
  return r;
}

double max_abs_err(const float* a, const float* b, int64_t n) {
  double e = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return e;
}

using moesq::test::topk_gap;
using moesq::test::topk_set;

class FamilyParity : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyParity, FullForwardMatchesTransformers) {
  const std::string arch = GetParam();
  const moesq::io::Checkpoint ck(fixture("tiny-" + arch));
  const DecoderModel m(ck);
  const auto& s = m.spec();
  const Reference ref = load_reference(arch, s);
  const int64_t B = ref.B, T = ref.T, H = s.hidden_size, V = s.vocab_size, E = s.num_experts, K = s.top_k,
                L = s.num_layers;
  ASSERT_EQ(ref.logits.size(), static_cast<size_t>(B * T * V));
  std::vector<double> hid(L + 1, 0.0), rl(L, 0.0);
  double lg = 0, logits_absmax = 0, nll = 0;
  int64_t mismatched = 0, separable = 0;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t> ids(ref.ids.begin() + b * T, ref.ids.begin() + (b + 1) * T);
    moesq::model::Trace tr;
    const std::vector<float> z = m.forward(ids, reference_options(), &tr);
    ASSERT_EQ(z.size(), static_cast<size_t>(T * V));
    for (float v : z) logits_absmax = std::max(logits_absmax, static_cast<double>(std::fabs(v)));
    lg = std::max(lg, max_abs_err(z.data(), &ref.logits[b * T * V], T * V));
    for (int64_t l = 0; l <= L; ++l)
      hid[l] = std::max(hid[l], max_abs_err(tr.hidden[l].data(), &ref.hidden[l][b * T * H], T * H));
    int64_t moe_idx = 0;
    for (int64_t l = 0; l < L; ++l) {
      if (!s.is_moe_layer(l)) {
        EXPECT_TRUE(tr.router_logits[l].empty()) << "dense layer " << l << " reported router logits";
        continue;
      }
      if (ref.router.empty()) continue;  // nothing to compare the routes with
      const std::vector<float>& zr_all = ref.router[moe_idx++];
      rl[l] = std::max(rl[l], max_abs_err(tr.router_logits[l].data(), &zr_all[b * T * E], T * E));
      for (int64_t t = 0; t < T; ++t) {
        const float* zr = &zr_all[(b * T + t) * E];
        if (topk_gap(zr, E, K) <= kTieGap) continue;
        ++separable;
        std::vector<int32_t> mine(&tr.routes[l].expert[t * K], &tr.routes[l].expert[t * K] + K);
        std::sort(mine.begin(), mine.end());
        mismatched += mine != topk_set(zr, E, K);
      }
    }
    for (int64_t t = 0; t + 1 < T; ++t) {  // transformers' shifted cross-entropy, mean over B·(T-1)
      const float* zt = &z[t * V];
      const double mx = *std::max_element(zt, zt + V);
      double se = 0;
      for (int64_t v = 0; v < V; ++v) se += std::exp(static_cast<double>(zt[v]) - mx);
      nll += mx + std::log(se) - zt[ids[t + 1]];
    }
  }
  const double ce = nll / static_cast<double>(B * (T - 1));
  for (int64_t l = 0; l <= L; ++l) {
    std::printf("%s hidden_states.%lld max abs err %.3g\n", arch.c_str(), static_cast<long long>(l), hid[l]);
    EXPECT_LE(hid[l], kHiddenAtol) << arch << " hidden_states." << l;
  }
  for (int64_t l = 0; l < L; ++l) {
    if (!s.is_moe_layer(l) || ref.router.empty()) continue;
    std::printf("%s router_logits (layer %lld) max abs err %.3g\n", arch.c_str(), static_cast<long long>(l), rl[l]);
    EXPECT_LE(rl[l], kRouterLogitsAtol) << arch << " router logits of layer " << l;
  }
  std::printf("%s logits max abs err %.3g; top-k: %lld of %lld separable token×layer sets differ; ce %.7f vs %.7f\n",
              arch.c_str(), lg, static_cast<long long>(mismatched), static_cast<long long>(separable), ce, ref.ce);
  EXPECT_LE(lg, kLogitsAtol) << arch << " logits";
  EXPECT_GT(logits_absmax, 0.1) << arch << ": logits are (nearly) all zero";
  EXPECT_TRUE(separable > 0 || ref.router.empty()) << arch << ": no separable top-k set was compared";
  EXPECT_EQ(mismatched, 0) << arch << ": top-k sets differ where the reference separates them";
  EXPECT_NEAR(ce, ref.ce, kCeAtol) << arch << " cross-entropy";
}

// Each decoder layer alone on the reference input of that layer (attention, then the feed-forward:
// routed experts + shared expert, or the dense MLP).
TEST_P(FamilyParity, EachLayerTeacherForced) {
  const std::string arch = GetParam();
  const moesq::io::Checkpoint ck(fixture("tiny-" + arch));
  const DecoderModel m(ck);
  const auto& s = m.spec();
  const Reference ref = load_reference(arch, s);
  const int64_t B = ref.B, T = ref.T, H = s.hidden_size;
  for (int64_t l = 0; l + 1 < s.num_layers; ++l) {  // the last reference state is after the final norm
    double e = 0;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<float> h(&ref.hidden[l][b * T * H], &ref.hidden[l][(b + 1) * T * H]);
      m.attention_block(l, h, T, reference_options());
      const std::vector<float> x = m.moe_input(l, h, T);
      const std::vector<float> y = m.ffn_block(l, x, T, reference_options());
      for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
      e = std::max(e, max_abs_err(h.data(), &ref.hidden[l + 1][b * T * H], T * H));
    }
    std::printf("%s layer %lld teacher-forced: max abs err %.3g\n", arch.c_str(), static_cast<long long>(l), e);
    EXPECT_LE(e, kHiddenAtol) << arch << " layer " << l;
  }
}

// The built-in attention's fast path against its plain-loop twin on each family's layout (biases,
// q/k norm span), on the reference's first layer input.
TEST_P(FamilyParity, AttentionMatchesItsRef) {
  const std::string arch = GetParam();
  const moesq::io::Checkpoint ck(fixture("tiny-" + arch));
  const DecoderModel m(ck);
  if (m.layer(0).mixer && !m.layer(0).mixer->has_forward_ref())
    GTEST_SKIP() << arch << ": layer 0's " << m.layer(0).mixer->name() << " mixer has no plain-loop twin";
  const Reference ref = load_reference(arch, m.spec());
  const int64_t T = ref.T, H = m.spec().hidden_size;
  std::vector<float> a(ref.hidden[0].begin(), ref.hidden[0].begin() + T * H), b = a;
  m.attention_block(0, a, T, reference_options());
  m.attention_block_ref(0, b, T, reference_options());
  constexpr double kRefAtol = 1e-5;  // same math, different summation order (sgemm blocking)
  EXPECT_LE(max_abs_err(a.data(), b.data(), T * H), kRefAtol) << arch;
  EXPECT_GT(max_abs_err(a.data(), ref.hidden[0].data(), T * H), 1e-3) << arch << ": attention added nothing";
}

// The KV-cached decoder (one token per step) against the full forward: covers the q/k norm span,
// q/k/v biases, the shared expert and dense layers on the decode path, and each family mixer's decode
// state (MLA's latent cache in the absorbed form; Gated DeltaNet's conv + recurrent state and the
// gated attention's and gpt-oss's sink attention's K/V cache).
TEST_P(FamilyParity, KvDecoderMatchesFullForward) {
  const std::string arch = GetParam();
  const moesq::io::Checkpoint ck(fixture("tiny-" + arch));
  const DecoderModel m(ck);
  for (int64_t l = 0; l < m.spec().num_layers; ++l)
    if (m.layer(l).mixer && !m.layer(l).mixer->new_decode_state(1, reference_options()))
      GTEST_SKIP() << arch << ": layer " << l << "'s " << m.layer(l).mixer->name() << " mixer has no decode path";
  const Reference ref = load_reference(arch, m.spec());
  const int64_t T = ref.T, V = m.spec().vocab_size;
  // Same math, matvec vs sgemm summation order (MLA: the absorbed association order too). Measured
  // max |Δ logit| over both 64-token reference sequences: qwen2-moe 4.0e-7, mixtral 5.4e-7, olmoe
  // 4.8e-7, deepseek-v3 5.4e-7, qwen3.5-moe 3.6e-6, gpt-oss 4.2e-7 (|logit| ≤ 1.8).
  constexpr double kDecodeAtol = 1e-4;
  double e = 0, absmax = 0;
  for (int64_t b = 0; b < ref.B; ++b) {
    const std::vector<int32_t> ids(ref.ids.begin() + b * T, ref.ids.begin() + (b + 1) * T);
    const std::vector<float> full = m.forward(ids, reference_options());
    moesq::model::KvDecoder dec(m, T, reference_options());
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> z = dec.step(ids[t]);
      e = std::max(e, max_abs_err(z.data(), &full[t * V], V));
      for (float v : z) absmax = std::max(absmax, static_cast<double>(std::fabs(v)));
    }
    EXPECT_EQ(dec.position(), T);
    EXPECT_THROW(dec.step(ids[0]), moesq::Error) << arch << ": a step past max_len must be refused";
  }
  std::printf("%s decode vs full forward: max abs logit err %.3g over %lld×%lld steps (|logit| max %.3g)\n",
              arch.c_str(), e, static_cast<long long>(ref.B), static_cast<long long>(T), absmax);
  EXPECT_LE(e, kDecodeAtol) << arch;
  EXPECT_GT(absmax, 0.1) << arch << ": decode logits are (nearly) all zero";
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyParity, ::testing::Values("qwen2-moe", "mixtral", "olmoe", "deepseek-v3",
                                                                              "qwen3.5-moe", "gpt-oss"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           std::replace(n.begin(), n.end(), '.', '_');
                           return n;
                         });

}  // namespace
