// Route alignment: vLLM moe_align_block_size semantics, native/canonical orders, membership,
// interventions, validation, and the paper-000 fixture numbers (168 routes → 400 rows, 50 blocks,
// one expert spanning blocks 40 and 41).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "support/moe_fixtures.h"
#include "ops/route_align/route_align.h"

using namespace moesq::format;
using namespace moesq::ops;

namespace {

using moesq::test::random_topk;

}  // namespace

TEST(Align, FixtureHasPaperShape) {
  const auto ids = make_fixture_topk_ids(0);
  ASSERT_EQ(ids.size(), 168u);
  for (int64_t t = 0; t < kFixtureM; ++t) {  // top-k ids of one token are distinct
    std::set<int32_t> row(ids.begin() + t * 8, ids.begin() + t * 8 + 8);
    EXPECT_EQ(row.size(), 8u) << "token " << t;
  }
  for (AlignOrder o : {AlignOrder::Canonical, AlignOrder::Native}) {
    const auto a = align_routes(ids, kFixtureM, kFixtureTopk, kFixtureExperts, kFixtureBlock, o, 7);
    EXPECT_EQ(a.padded_total(), 400);
    EXPECT_EQ(a.num_blocks(), 50);
    EXPECT_EQ(a.sentinel(), 168);
    EXPECT_EQ(a.block_expert[40], kFixtureSpanExpert);
    EXPECT_EQ(a.block_expert[41], kFixtureSpanExpert);
    EXPECT_NE(a.block_expert[39], kFixtureSpanExpert);
    EXPECT_NE(a.block_expert[42], kFixtureSpanExpert);
    EXPECT_EQ(std::count(a.sorted_ids.begin(), a.sorted_ids.end(), 168), 400 - 168);
    EXPECT_NO_THROW(validate_alignment(a, ids));
  }
}

TEST(Align, MatchesVllmSemanticsOnRandomRouting) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const int64_t M = 1 + seed * 13;
    const int k = 4, E = 16, b = 8;
    const auto ids = random_topk(M, k, E, seed);
    const auto a = align_routes(ids, M, k, E, b, AlignOrder::Canonical);
    // Independent recount: padded total = Σ_e ceil(count_e / b)·b, experts ascending.
    std::vector<int64_t> cnt(E, 0);
    for (int32_t e : ids) ++cnt[e];
    int64_t total = 0;
    for (int e = 0; e < E; ++e) total += (cnt[e] + b - 1) / b * b;
    EXPECT_EQ(a.padded_total(), total) << "M=" << M;
    EXPECT_TRUE(std::is_sorted(a.block_expert.begin(), a.block_expert.end()));
    // Canonical: inside each expert region, valid routes ascend.
    for (int64_t i = 1; i < a.padded_total(); ++i) {
      const int32_t r0 = a.sorted_ids[i - 1], r1 = a.sorted_ids[i];
      if (r0 != a.sentinel() && r1 != a.sentinel() && ids[r0] == ids[r1]) EXPECT_LT(r0, r1) << "row " << i;
    }
    EXPECT_NO_THROW(validate_alignment(a, ids));
  }
}

TEST(Align, NativeHistoriesDifferCanonicalDoesNot) {
  const auto ids = make_fixture_topk_ids(0);
  std::set<std::string> native_fp, canon_fp;
  for (uint64_t h = 0; h < 20; ++h) {
    native_fp.insert(route_block_fingerprint(
        align_routes(ids, kFixtureM, kFixtureTopk, kFixtureExperts, kFixtureBlock, AlignOrder::Native, h)));
    canon_fp.insert(route_block_fingerprint(
        align_routes(ids, kFixtureM, kFixtureTopk, kFixtureExperts, kFixtureBlock, AlignOrder::Canonical, h)));
  }
  EXPECT_GT(native_fp.size(), 1u);  // membership of blocks 40/41 depends on the history
  EXPECT_EQ(canon_fp.size(), 1u);
}

TEST(Align, InterventionsChangeMembershipOnlyAcrossBlocks) {
  const auto ids = make_fixture_topk_ids(0);
  const auto a = align_routes(ids, kFixtureM, kFixtureTopk, kFixtureExperts, kFixtureBlock, AlignOrder::Native, 0);
  const std::string fp = route_block_fingerprint(a);
  const int32_t in40a = a.sorted_ids[40 * 8], in40b = a.sorted_ids[40 * 8 + 1], in41 = a.sorted_ids[41 * 8];
  auto r = a;
  intervene_reorder(r, in40a, in40b);
  EXPECT_NE(r.sorted_ids, a.sorted_ids);
  EXPECT_EQ(route_block_fingerprint(r), fp);
  EXPECT_NO_THROW(validate_alignment(r, ids));
  auto x = a;
  intervene_exchange(x, in40a, in41);
  EXPECT_NE(route_block_fingerprint(x), fp);
  EXPECT_NO_THROW(validate_alignment(x, ids));
  EXPECT_EQ(find_route(x, in40a).block, 41);
  auto bad = a;
  EXPECT_THROW(intervene_reorder(bad, in40a, in41), moesq::Error);
  EXPECT_THROW(intervene_exchange(bad, in40a, a.sorted_ids[0]), moesq::Error);  // different experts
}

TEST(Align, ValidationRejectsCorruptPlans) {
  const auto ids = make_fixture_topk_ids(0);
  const auto a = align_routes(ids, kFixtureM, kFixtureTopk, kFixtureExperts, kFixtureBlock, AlignOrder::Canonical);
  auto expect_reason = [&](const RouteAlignment& bad, const std::string& prefix) {
    try {
      validate_alignment(bad, ids);
      ADD_FAILURE() << "accepted a plan that should fail with " << prefix;
    } catch (const moesq::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
    }
  };
  auto r = a;  // a route of another expert put in block 0
  std::swap(r.sorted_ids[0], r.sorted_ids[41 * 8]);
  expect_reason(r, "route:");
  auto e = a;
  e.block_expert[3] = e.block_expert[3] + 1 < kFixtureExperts ? e.block_expert[3] + 1 : 0;
  expect_reason(e, "expert block:");
  auto d = a;  // duplicate route
  d.sorted_ids[1] = d.sorted_ids[0];
  expect_reason(d, "route:");
}
