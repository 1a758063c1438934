// The GPU engine's Gated DeltaNet block as its twins run it (runtime::gdn_block_ref: rmsnorm → fused
// [qkv | z | b | a] GEMM → conv → recurrence → out_proj) against the CPU model's own pieces on the
// Qwen3-Next and Qwen3.5 fixtures' linear_attention layers: the input RMSNorm with 1 + w, then
// model::gated_deltanet_forward with a state carried across calls, added to the residual. Two sequences
// in two slots over three calls of uneven runs, as the engine's forward and decode steps feed it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config_hybrid.h"
#include "model/mixers/family_load.h"
#include "model/mixers/gated_deltanet.h"
#include "model/tensor_math.h"
#include "runtime/layers/gdn_block.h"

namespace {

using namespace moesq;

// The block's GEMM inputs are bf16 hi + lo (≈ 2^-17 relative) where the mixer's are fp32, and the
// GEMM sums in another order: ≈ 1e-6 of the largest output; 1e-4 leaves room for the recurrence.
constexpr double kBlockVsModelRel = 1e-4;

TEST(GdnBlockRef, MatchesTheCpuMixerOnTheHybridFixtures) {
  for (const char* dir : {"tiny-qwen3-next", "tiny-qwen3.5-moe"}) {
    const io::Checkpoint ck(std::string(MOESQ_FIXTURES) + "/families/" + dir);
    const io::FamilySpec f = io::parse_family_config(ck.config(), ck.dir() + "/config.json");
    int64_t l = 0;
    while (f.layer_mixer.at(l) != io::MixerKind::GatedDeltaNet) ++l;
    const runtime::GdnBlockDims d = runtime::gdn_block_dims(f);
    const runtime::HostGdn w = runtime::load_host_gdn(ck, f, l);
    const model::GdnShape gs = model::family_gdn_shape(f);
    model::GdnWeights gw;
    model::family_load::load_gdn(ck, f, gs, l, gw);
    const int64_t H = d.H;
    std::mt19937 g(31);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    // Sequence A (slot 1) of 19 tokens and B (slot 0) of 9, cut into three calls.
    const int64_t TA = 19, TB = 9;
    std::vector<float> ha(TA * H), hb(TB * H);
    for (float& v : ha) v = nd(g);
    for (float& v : hb) v = nd(g);
    auto model_side = [&](const std::vector<float>& h, int64_t T) {
      std::vector<float> x(T * H), y(T * H), out = h;
      model::rmsnorm_rows(h.data(), T, H, w.input_norm.data(), d.eps, x.data());
      model::gated_deltanet_forward(gs, gw, x.data(), T, y.data(), nullptr, 1);
      for (int64_t i = 0; i < T * H; ++i) out[i] += y[i];
      return out;
    };
    const std::vector<float> want_a = model_side(ha, TA), want_b = model_side(hb, TB);
    std::vector<float> window(2 * d.window_floats(), 0.0f), S(2 * d.state_floats(), 0.0f);
    const int64_t cuts_a[] = {0, 12, 13, 19}, cuts_b[] = {0, 1, 9, 9};  // B: prompt of 1, then 8, then none
    double worst = 0.0, top = 0.0;
    for (int call = 0; call < 3; ++call) {
      const int64_t a0 = cuts_a[call], a1 = cuts_a[call + 1], b0 = cuts_b[call], b1 = cuts_b[call + 1];
      std::vector<float> h(ha.begin() + a0 * H, ha.begin() + a1 * H);  // A's run first, then B's
      h.insert(h.end(), hb.begin() + b0 * H, hb.begin() + b1 * H);
      const std::vector<int32_t> start = {0, static_cast<int32_t>(a1 - a0), static_cast<int32_t>(a1 - a0 + b1 - b0)};
      const std::vector<int32_t> slot = {1, 0};
      const ops::GdnRuns runs{start.data(), slot.data(), 2, 2};
      runtime::gdn_block_ref(d, w, runs, window.data(), S.data(), start.back(), h.data());
      for (int64_t i = 0; i < (a1 - a0) * H; ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(h[i]) - want_a[a0 * H + i]));
        top = std::max(top, std::fabs(static_cast<double>(want_a[a0 * H + i] - ha[a0 * H + i])));
      }
      for (int64_t i = 0; i < (b1 - b0) * H; ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(h[(a1 - a0) * H + i]) - want_b[b0 * H + i]));
    }
    ASSERT_GT(top, 0.0) << dir << ": the block added nothing";
    EXPECT_LE(worst / top, kBlockVsModelRel) << dir << " layer " << l << ": max |Δ| " << worst << " of " << top;
  }
}

}  // namespace
