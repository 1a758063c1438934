// JSON forms of alignment plans (audit/plan_json.h): a round trip keeps the plan and its membership
// fingerprint, with most experts empty.
#include <gtest/gtest.h>

#include "audit/plan_json.h"
#include "core/error.h"
#include "support/moe_fixtures.h"

using namespace moesq::moe;
using moesq::test::random_topk;

TEST(Align, JsonRoundTripAndEmptyExperts) {
  const auto ids = random_topk(3, 2, 64, 9);  // most experts empty
  const auto a = align_routes(ids, 3, 2, 64, 4, AlignOrder::Native, 5);
  const auto back = alignment_from_json(alignment_to_json(a), "test");
  EXPECT_EQ(back.sorted_ids, a.sorted_ids);
  EXPECT_EQ(back.block_expert, a.block_expert);
  EXPECT_EQ(route_block_fingerprint(back), route_block_fingerprint(a));
  EXPECT_THROW(align_routes({0, 70}, 1, 2, 64, 4, AlignOrder::Native), moesq::Error);  // id out of range
}
