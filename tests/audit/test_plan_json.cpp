// JSON forms of alignment plans (audit/plan_json.h): a round trip keeps the plan and its membership
// fingerprint, with most experts empty.
#include <gtest/gtest.h>

#include "audit/plan_json.h"
#include "core/error.h"
#include "support/moe_fixtures.h"

using namespace moesq::audit;
using namespace moesq::format;
using namespace moesq::ops;
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

// Regressions from fuzz/fuzz_plan.cpp (docs/RELIABILITY.md "fuzzing"). A plan value that is not an
// int32 integer (1e68 in sorted_ids was a float-to-int cast with undefined behaviour), an M·k past
// int32, or a plan claiming fewer experts than the top-k ids use (validate_alignment indexed past its
// per-expert counts) is an Error naming the key / route, never UB or an out-of-bounds write.
namespace {
nlohmann::json small_plan() {
  return alignment_to_json(align_routes({0, 1, 1, 2, 3, 0}, 3, 2, 4, 2, AlignOrder::Canonical));
}
std::string error_of(const nlohmann::json& j, const std::vector<int32_t>* ids = nullptr) {
  try {
    const RouteAlignment a = alignment_from_json(j, "plan.json");
    if (ids) validate_alignment(a, *ids);
  } catch (const moesq::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(PlanJson, NonIntegerOrOutOfRangeValuesNameTheKey) {
  ASSERT_EQ(error_of(small_plan()), "");
  auto with = [](const char* key, const nlohmann::json& v, int index = -1) {
    nlohmann::json j = small_plan();
    if (index < 0) j[key] = v;
    else j[key][index] = v;
    return error_of(j);
  };
  EXPECT_NE(with("sorted_ids", 1e68, 1).find("sorted_ids[1]"), std::string::npos) << with("sorted_ids", 1e68, 1);
  EXPECT_NE(with("sorted_ids", 4294967296ll, 0).find("sorted_ids[0]"), std::string::npos);
  EXPECT_NE(with("block_expert", 2.5, 0).find("block_expert[0]"), std::string::npos);
  EXPECT_NE(with("topk", 1e300).find("topk"), std::string::npos);
  EXPECT_NE(with("topk", 0).find("topk"), std::string::npos);
  EXPECT_NE(with("M", 9223372036854775807ll).find("M = "), std::string::npos);  // M·k would overflow
  EXPECT_NE(with("M", 18446744073709551615ull).find("M = "), std::string::npos);
  EXPECT_NE(with("num_experts", -3).find("num_experts"), std::string::npos);
  EXPECT_NE(with("block_size", "8").find("block_size"), std::string::npos);
  EXPECT_NE(with("sorted_ids", nlohmann::json::object()).find("sorted_ids"), std::string::npos);
  EXPECT_NE(error_of(nlohmann::json::array()).find("plan.json"), std::string::npos);
}

TEST(PlanJson, PlanWithFewerExpertsThanTheRoutesUseIsRefused) {
  const std::vector<int32_t> ids = {0, 1, 1, 2, 3, 0};  // experts 0..3
  nlohmann::json j = small_plan();
  ASSERT_EQ(error_of(j, &ids), "");
  j["num_experts"] = 2;  // routes go to experts 2 and 3
  const std::string e = error_of(j, &ids);
  EXPECT_EQ(e.rfind("expert block:", 0), 0u) << e;
  EXPECT_NE(e.find("expert 2"), std::string::npos) << e;
}
