// CPU tests of the host half of the GPU engine's non-finite check (runtime/finite_check.h): the check
// sites number every stage in forward order (the record keeps the smallest, so this order is what
// "first" means), and a record becomes a moesq::Error (NonFiniteError) naming the layer (1-based of L,
// core::layer_label), the stage, the expert and the token with its slot and position, and what to do.
// The GPU half (the kernel, the engine's launches) is tested in tests/gpu/test_finite_check.cu and
// tests/gpu/test_engine_check_finite.cu.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/finite_check.h"

namespace {

using moesq::ops::FiniteFinding;
using moesq::ops::FiniteKind;
using moesq::runtime::finite_site;
using moesq::runtime::FiniteRows;
using moesq::runtime::FiniteStage;
using moesq::runtime::NonFiniteError;

constexpr FiniteStage kLayerStages[] = {FiniteStage::kAttention, FiniteStage::kRouterLogits, FiniteStage::kExpertGateUp,
                                        FiniteStage::kExpertOutput, FiniteStage::kMoeOutput};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

FiniteFinding finding(int64_t layer, FiniteStage stage, int64_t group, int64_t row,
                      FiniteKind kind = FiniteKind::kNan) {
  FiniteFinding f;
  f.found = true, f.site = finite_site(layer, stage), f.group = group, f.row = row, f.kind = kind;
  return f;
}

// Embedding, then each layer's stages in the order the engine runs them, then the logits: strictly
// increasing sites that decode back to their (layer, stage).
TEST(RuntimeFiniteCheck, SitesFollowTheForward) {
  const int64_t L = 48;
  std::vector<std::pair<int64_t, FiniteStage>> order = {{-1, FiniteStage::kEmbedding}};
  for (int64_t l = 0; l < L; ++l)
    for (FiniteStage s : kLayerStages) order.emplace_back(l, s);
  order.emplace_back(L, FiniteStage::kLogits);
  uint32_t prev = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const uint32_t site = finite_site(order[i].first, order[i].second);
    if (i > 0) {
      EXPECT_GT(site, prev) << "layer " << order[i].first << " stage " << static_cast<int>(order[i].second);
    }
    prev = site;
    const moesq::runtime::FiniteSite back = moesq::runtime::finite_site_of(site);
    EXPECT_EQ(back.layer, order[i].first);
    EXPECT_EQ(back.stage, order[i].second);
    EXPECT_LE(site, moesq::ops::kFiniteMaxSite);
  }
  EXPECT_LE(finite_site(moesq::runtime::kFiniteMaxLayers, FiniteStage::kLogits), moesq::ops::kFiniteMaxSite);
  EXPECT_THROW(finite_site(moesq::runtime::kFiniteMaxLayers + 1, FiniteStage::kLogits), moesq::Error);
  EXPECT_THROW(finite_site(-2, FiniteStage::kEmbedding), moesq::Error);
}

// The expert stages name the expert (the record's group) and the token of the batch with its slot and
// position; the message says what to look at and how to compare.
TEST(RuntimeFiniteCheck, ExpertFindingNamesLayerExpertTokenAndWhatToDo) {
  FiniteRows rows;
  rows.slot = {0, 0, 0, 0, 0, 1, 1, 1};
  rows.pos = {0, 1, 2, 3, 4, 0, 1, 2};
  rows.out_rows = {4, 7};
  const NonFiniteError e(finding(2, FiniteStage::kExpertOutput, 17, 6), 4, rows);
  const std::string m = e.what();
  EXPECT_TRUE(contains(m, "GPU forward: NaN in layer 3/4, expert 17 output (down projection)")) << m;
  EXPECT_TRUE(contains(m, "token 6 of the batch (slot 1, position 1)")) << m;
  EXPECT_TRUE(contains(m, "--check-finite")) << m;
  EXPECT_TRUE(contains(m, "--device cpu")) << m;
  EXPECT_TRUE(contains(m, "--experts bf16")) << m;
  EXPECT_EQ(e.layer, 2);
  EXPECT_EQ(e.stage, FiniteStage::kExpertOutput);
  EXPECT_EQ(e.expert, 17);
  EXPECT_EQ(e.token, 6);
  EXPECT_EQ(e.slot, 1);
  EXPECT_EQ(e.position, 1);
  const moesq::Error& as_error = e;  // the CLI's normal error path: "moesq: error: ...", exit 1
  EXPECT_EQ(std::string(as_error.what()), m);

  const std::string gu =
      moesq::runtime::non_finite_message(finding(0, FiniteStage::kExpertGateUp, 5, 2, FiniteKind::kPosInf), 4, rows);
  EXPECT_TRUE(contains(gu, "+inf in layer 1/4, expert 5 gate|up output")) << gu;
  EXPECT_TRUE(contains(gu, "gate and up weights")) << gu;
}

// Stages that are not per expert name no expert (the record's group is 0 there, not expert 0).
TEST(RuntimeFiniteCheck, OtherStagesNameNoExpert) {
  FiniteRows rows;
  rows.slot = {3, 3, 3};
  rows.pos = {10, 11, 12};
  rows.out_rows = {2};
  struct Case {
    int64_t layer;
    FiniteStage stage;
    std::string want;
  };
  for (const Case& c : {Case{-1, FiniteStage::kEmbedding, "NaN in the embedding output at token 1"},
                        Case{0, FiniteStage::kAttention, "NaN in layer 1/4 attention output"},
                        Case{1, FiniteStage::kRouterLogits, "NaN in layer 2/4 router logits"},
                        Case{3, FiniteStage::kMoeOutput, "NaN in layer 4/4 MoE output"}}) {
    const NonFiniteError e(finding(c.layer, c.stage, 0, 1), 4, rows);
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, c.want)) << m;
    EXPECT_TRUE(contains(m, "(slot 3, position 11)")) << m;
    EXPECT_FALSE(contains(m, "expert 0")) << m;
    EXPECT_EQ(e.expert, -1) << m;
    EXPECT_EQ(e.layer, c.layer) << m;
  }
}

// The logits' row is an OUTPUT row: named through out_rows (here the last token of the second chunk).
TEST(RuntimeFiniteCheck, LogitsRowIsNamedByItsToken) {
  FiniteRows rows;
  rows.slot = {0, 0, 1, 1, 1};
  rows.pos = {0, 1, 0, 1, 2};
  rows.out_rows = {1, 4};
  const NonFiniteError e(finding(4, FiniteStage::kLogits, 0, 1, FiniteKind::kNegInf), 4, rows);
  const std::string m = e.what();
  EXPECT_TRUE(contains(m, "-inf in the logits (final norm + lm_head) at token 4 of the batch (slot 1, position 2)"))
      << m;
  EXPECT_EQ(e.token, 4);
  EXPECT_EQ(e.row, 1);
  // Without the rows (an out-of-range row): the logits row itself, never a wrong token.
  const NonFiniteError bare(finding(4, FiniteStage::kLogits, 0, 9), 4, FiniteRows{});
  EXPECT_TRUE(contains(bare.what(), "at logits row 9")) << bare.what();
  EXPECT_EQ(bare.token, -1);
}

}  // namespace
