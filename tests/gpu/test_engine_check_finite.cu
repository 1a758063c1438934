// GPU tests of the engine's non-finite check (EngineOptions::check_finite, the CLI's --check-finite;
// runtime/finite_check.h) on the tiny Qwen3-MoE fixture. A NaN put into the host model before upload —
// one expert's gate|up or down weights, one layer's o_proj, one embedding row, one lm_head row — gives
// NonFiniteError naming exactly that layer, stage and expert, and the token (with its slot and position)
// where it first appears: for an expert, the first token routed to it, taken from the CPU forward's
// routing with a margin so the GPU routes the same. With the check off the same engine runs without an
// error (the NaN reaches the logits silently: what the check is for). On a clean model check on and off
// give BITWISE the same logits in prefill and decode (the check only reads), and after a finding the
// engine goes on (the record is emptied; the slot's length stays as it was).
// The compressed checkpoint (paired 4:8, sparse-w4a4 backend) comes from MOESQ_TINY_COMPRESSED, as in
// test_engine.cu; without it that one test is skipped, saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/kernel_layout.h"
#include "io/checkpoint.h"
#include "model/decoder.h"
#include "runtime/engine.h"
#include "runtime/experts/bf16.h"
#include "runtime/experts/paired_sparse.h"
#include "runtime/finite_check.h"
#include "runtime/weights.h"
#include "support/gpu_test_main.h"
#include "support/text_tokens.h"

using namespace moesq;
using runtime::FiniteStage;
using runtime::NonFiniteError;

namespace {

constexpr uint16_t kBf16Nan = 0x7fc0;
// Router-logit margin by which the chosen expert is inside its token's top-k and outside every earlier
// token's: far above the CPU (fp32) vs GPU (bf16 hi + lo inputs) router-logit differences (~1e-4), so
// the first token the GPU routes to the expert is the CPU's.
constexpr float kRouteMargin = 2e-2f;

std::string tiny() { return MOESQ_DEFAULT_MODEL; }
std::string compressed() {
  const char* p = std::getenv("MOESQ_TINY_COMPRESSED");
  return p ? p : "";
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

runtime::EngineOptions options(bool check) {
  runtime::EngineOptions o;
  o.max_seqs = 3, o.max_len = 96, o.check_finite = check;
  return o;
}

struct Target {
  int64_t token = -1, expert = -1;
};

// Where logical column k of a bf16 expert row is stored (bf16.h: K in kKMajor order).
int64_t stored(int64_t k) { return format::act_storage_index(k, format::ActLayout::kKMajor); }

// A token t ≥ 1 of `prompt` whose top-1 expert e in layer l is in its top-k by kRouteMargin and outside
// the top-k of every earlier token by kRouteMargin (CPU forward, the model's own options): a NaN in
// expert e's weights then first shows at token t.
Target pick_target(const std::string& dir, const std::vector<int32_t>& prompt, int64_t l) {
  const io::Checkpoint ckpt(dir);
  const model::DecoderModel cpu(ckpt);
  model::Trace tr;
  cpu.forward(prompt, cpu.default_forward_options(), &tr);
  const model::Routes& r = tr.routes.at(l);
  const int64_t E = cpu.spec().num_experts, k = r.k;
  auto sorted = [&](int64_t t) {
    std::vector<float> z(r.logits.begin() + t * E, r.logits.begin() + (t + 1) * E);
    std::sort(z.begin(), z.end(), std::greater<float>());
    return z;
  };
  for (int64_t t = 1; t < r.n; ++t) {
    const int64_t e = r.expert[t * k];
    const std::vector<float> zt = sorted(t);
    if (zt[0] - zt[k] < kRouteMargin) continue;
    bool first = true;
    for (int64_t u = 0; u < t && first; ++u) first = sorted(u)[k - 1] - r.logits[u * E + e] >= kRouteMargin;
    if (first) return {t, e};
  }
  ADD_FAILURE() << "no token of the prompt has a top-1 expert clear of every earlier token in layer " << l;
  return {};
}

runtime::HostModel bf16_host() {
  const io::Checkpoint ckpt(tiny());
  return runtime::load_host_model(ckpt, runtime::ExpertBackend::kBf16);
}

runtime::Bf16HostExperts& bf16_experts(runtime::HostModel& m, int64_t l) {
  return dynamic_cast<runtime::Bf16HostExperts&>(*m.layers.at(l).moe.experts);
}

// The NonFiniteError of `run` (a failure when it throws none).
NonFiniteError caught(const std::function<void()>& run, const std::string& what) {
  try {
    run();
  } catch (const NonFiniteError& e) {
    std::printf("[check-finite] %s: %s\n", what.c_str(), e.what());
    return e;
  }
  ADD_FAILURE() << what << ": no NonFiniteError";
  return NonFiniteError(ops::FiniteFinding{}, 0, {});
}

bool any_non_finite(const std::vector<float>& z) {
  return std::any_of(z.begin(), z.end(), [](float v) { return !std::isfinite(v); });
}

// The check only reads: with it on, prefill and decode logits are bitwise those with it off (another
// engine, and the same engine switched), and nothing is reported on the clean fixture.
TEST(EngineCheckFinite, CleanModelGivesTheSameBitsWithTheCheckOnAndOff) {
  const io::Checkpoint ckpt(tiny());
  runtime::Engine off(ckpt, options(false)), on(ckpt, options(true));
  EXPECT_FALSE(off.check_finite());
  EXPECT_TRUE(on.check_finite());
  const std::vector<int32_t> a = test::text_tokens(37, 1), b = test::text_tokens(20, 2), next = test::text_tokens(6, 3);
  auto run = [&](runtime::Engine& eng) {
    eng.reset();
    std::vector<float> z = eng.forward({{0, a}, {2, b}}, true);
    for (int32_t t : next) {
      const std::vector<float> d = eng.decode({2, 0}, {t, t});  // the decode graph, with its checks when on
      z.insert(z.end(), d.begin(), d.end());
    }
    return z;
  };
  const std::vector<float> z_off = run(off), z_on = run(on);
  ASSERT_EQ(z_on.size(), z_off.size());
  for (size_t i = 0; i < z_off.size(); ++i) ASSERT_EQ(bits(z_on[i]), bits(z_off[i])) << "logit " << i;
  EXPECT_FALSE(any_non_finite(z_off));
  off.set_check_finite(true);  // switching drops the graphs; the next ones carry the checks
  const std::vector<float> z_switched = run(off);
  for (size_t i = 0; i < z_off.size(); ++i) ASSERT_EQ(bits(z_switched[i]), bits(z_off[i])) << "switched, logit " << i;
}

// A NaN in one weight of expert e's gate rows (layer 3/4): the first stage that goes bad is that
// expert's gate|up output, at the first token routed to it. With the check off: no error, NaN logits.
TEST(EngineCheckFinite, NanInOneExpertsGateUpNamesLayerExpertAndToken) {
  const int64_t layer = 2;
  const std::vector<int32_t> prompt = test::text_tokens(48, 11);
  const Target want = pick_target(tiny(), prompt, layer);
  ASSERT_GE(want.expert, 0);
  runtime::HostModel host = bf16_host();
  const runtime::MoeBlockDims d = runtime::moe_block_dims(host.spec);
  bf16_experts(host, layer).gu.at((want.expert * 2 * d.I + 0) * d.H_pad + stored(0)) = kBf16Nan;  // gate row 0
  runtime::Engine eng(std::move(host), options(true));
  const NonFiniteError e = caught([&] { eng.forward({{2, prompt}}, true); }, "gate|up NaN");
  EXPECT_EQ(e.layer, layer);
  EXPECT_EQ(e.stage, FiniteStage::kExpertGateUp);
  EXPECT_EQ(e.expert, want.expert);
  EXPECT_EQ(e.token, want.token);
  EXPECT_EQ(e.slot, 2);
  EXPECT_EQ(e.position, want.token);
  EXPECT_EQ(e.kind, ops::FiniteKind::kNan);
  const std::string m = e.what();
  EXPECT_NE(m.find("NaN in layer 3/4, expert " + std::to_string(want.expert) + " gate|up output"), std::string::npos)
      << m;
  EXPECT_NE(m.find("(slot 2, position " + std::to_string(want.token) + ")"), std::string::npos) << m;
  EXPECT_EQ(eng.length(2), 0) << "a failed forward leaves the slot as it was";
  // Off: the same engine runs through and the NaN reaches the logits unreported.
  eng.set_check_finite(false);
  eng.reset();
  std::vector<float> z;
  EXPECT_NO_THROW(z = eng.forward({{2, prompt}}, true));
  EXPECT_TRUE(any_non_finite(z)) << "the poisoned expert did not reach the logits: the test poisons nothing";
}

// A NaN in expert e's down projection: its gate|up output is finite, its output is not.
TEST(EngineCheckFinite, NanInOneExpertsDownNamesItsOutput) {
  const int64_t layer = 1;
  const std::vector<int32_t> prompt = test::text_tokens(48, 12);
  const Target want = pick_target(tiny(), prompt, layer);
  ASSERT_GE(want.expert, 0);
  runtime::HostModel host = bf16_host();
  const runtime::MoeBlockDims d = runtime::moe_block_dims(host.spec);
  bf16_experts(host, layer).down.at((want.expert * d.H + 5) * d.I_pad + stored(0)) = kBf16Nan;  // output column 5
  runtime::Engine eng(std::move(host), options(true));
  const NonFiniteError e = caught([&] { eng.forward({{0, prompt}}, false); }, "down NaN");
  EXPECT_EQ(e.layer, layer);
  EXPECT_EQ(e.stage, FiniteStage::kExpertOutput);
  EXPECT_EQ(e.expert, want.expert);
  EXPECT_EQ(e.token, want.token);
  const std::string m = e.what();
  EXPECT_NE(m.find("layer 2/4, expert " + std::to_string(want.expert) + " output (down projection)"), std::string::npos)
      << m;
}

// Stages outside the experts: o_proj (attention output, token 0), an embedding row met in a decode step
// (named by its slot and position; the engine then decodes a clean token at the same position), and
// an lm_head row (the logits, named through the output row's token).
TEST(EngineCheckFinite, AttentionEmbeddingAndLogitsAreNamed) {
  const std::vector<int32_t> a = test::text_tokens(30, 21), b = test::text_tokens(19, 22);
  ASSERT_EQ(std::count(a.begin(), a.end(), 7), 0);  // token id 7 is the poisoned embedding row below
  {
    runtime::HostModel host = bf16_host();
    host.layers.at(1).attn.o.at(0) = kBf16Nan;  // o_proj [H, nh·hd]: output column 0 of every token
    runtime::Engine eng(std::move(host), options(true));
    const NonFiniteError e = caught([&] { eng.forward({{1, a}}, false); }, "o_proj NaN");
    EXPECT_EQ(e.layer, 1);
    EXPECT_EQ(e.stage, FiniteStage::kAttention);
    EXPECT_EQ(e.expert, -1);
    EXPECT_EQ(e.token, 0);
    EXPECT_EQ(e.slot, 1);
    EXPECT_NE(std::string(e.what()).find("NaN in layer 2/4 attention output"), std::string::npos) << e.what();
  }
  {
    runtime::HostModel host = bf16_host();
    const int64_t H = host.spec.hidden_size;
    host.embed.at(7 * H + 3) = kBf16Nan;
    runtime::Engine eng(std::move(host), options(true));
    EXPECT_NO_THROW(eng.forward({{1, a}}, false));
    const NonFiniteError e = caught([&] { eng.decode({1}, {7}); }, "embedding NaN in decode");
    EXPECT_EQ(e.layer, -1);
    EXPECT_EQ(e.stage, FiniteStage::kEmbedding);
    EXPECT_EQ(e.token, 0);
    EXPECT_EQ(e.slot, 1);
    EXPECT_EQ(e.position, static_cast<int64_t>(a.size()));
    EXPECT_EQ(eng.length(1), static_cast<int64_t>(a.size()));
    // The record was emptied and the length kept: a clean token at the same position decodes.
    std::vector<float> z;
    EXPECT_NO_THROW(z = eng.decode({1}, {a[0]}));
    EXPECT_FALSE(any_non_finite(z));
    EXPECT_EQ(eng.length(1), static_cast<int64_t>(a.size()) + 1);
  }
  {
    runtime::HostModel host = bf16_host();
    const int64_t H = host.spec.hidden_size, L = host.spec.num_layers;
    host.lm_head.at(5 * H + 0) = kBf16Nan;  // logit 5 of every row
    runtime::Engine eng(std::move(host), options(true));
    const NonFiniteError e = caught([&] { eng.forward({{0, a}, {1, b}}, false); }, "lm_head NaN");
    EXPECT_EQ(e.layer, L);
    EXPECT_EQ(e.stage, FiniteStage::kLogits);
    EXPECT_EQ(e.row, 0);
    EXPECT_EQ(e.token, static_cast<int64_t>(a.size()) - 1);  // the output row of chunk 0: its last token
    EXPECT_EQ(e.slot, 0);
    EXPECT_EQ(e.position, static_cast<int64_t>(a.size()) - 1);
  }
}

// The paired 4:8 W4A4 backend (ops::sparse_gemm): γ_w = 0 for expert e of layer 1/4 makes its GEMM
// epilogue factor 1/γ_w infinite, so its gate|up output is non-finite for the tokens routed to it.
TEST(EngineCheckFinite, SparseW4A4ExpertWithAnInfiniteScaleIsNamed) {
  if (compressed().empty()) GTEST_SKIP() << "set MOESQ_TINY_COMPRESSED to a `moesq compress --method sgptq` output";
  const int64_t layer = 0;  // its router input does not depend on any compressed expert
  const std::vector<int32_t> prompt = test::text_tokens(48, 13);
  const Target want = pick_target(compressed(), prompt, layer);
  ASSERT_GE(want.expert, 0);
  const io::Checkpoint ckpt(compressed());
  runtime::HostModel host = runtime::load_host_model(ckpt, runtime::ExpertBackend::kSparseW4A4);
  auto& ex = dynamic_cast<runtime::PairedSparseHostExperts&>(*host.layers.at(layer).moe.experts);
  ex.gu.gamma.at(want.expert) = 0.0f;
  runtime::Engine eng(std::move(host), options(true));
  const NonFiniteError e = caught([&] { eng.forward({{0, prompt}}, false); }, "sparse-w4a4 gamma 0");
  EXPECT_EQ(e.layer, layer);
  EXPECT_EQ(e.stage, FiniteStage::kExpertGateUp);
  EXPECT_EQ(e.expert, want.expert);
  EXPECT_EQ(e.token, want.token);
}

}  // namespace

int main(int argc, char** argv) { return moesq::test::gpu_test_main(argc, argv); }
