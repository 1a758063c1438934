// JSON forms of alignment plans and tile schedules (plan_json.h).
#include "audit/plan_json.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"

namespace moesq::audit {

nlohmann::json alignment_to_json(const ops::RouteAlignment& a) {
  return {{"M", a.M},
          {"topk", a.topk},
          {"num_experts", a.num_experts},
          {"block_size", a.block_size},
          {"padded_total", a.padded_total()},
          {"num_blocks", a.num_blocks()},
          {"sorted_ids", a.sorted_ids},
          {"block_expert", a.block_expert}};
}

namespace {

// An integer JSON value in [lo, hi]; Error naming `where` and `key` otherwise. nlohmann's get<int>()
// casts a float like 1e68 or an unsigned 2^40 without a check (undefined behaviour for the float,
// found by fuzz/fuzz_plan.cpp), so the range is checked on the int64 / double first.
int64_t get_int_in(const nlohmann::json& v, const std::string& where, const std::string& key, int64_t lo, int64_t hi) {
  MOESQ_CHECK(v.is_number_integer(), where, ": ", key, " must be an integer, got ", v.dump());
  MOESQ_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(hi), where, ": ", key, " = ",
              v.dump(), " is outside [", lo, ", ", hi, "]");
  const int64_t x = v.get<int64_t>();
  MOESQ_CHECK(x >= lo && x <= hi, where, ": ", key, " = ", x, " is outside [", lo, ", ", hi, "]");
  return x;
}

std::vector<int32_t> get_ids(const nlohmann::json& j, const std::string& where, const std::string& key) {
  const nlohmann::json& v = j.at(key);
  MOESQ_CHECK(v.is_array(), where, ": ", key, " must be a list of integers");
  std::vector<int32_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(static_cast<int32_t>(get_int_in(v[i], where, key + "[" + std::to_string(i) + "]",
                                                  std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max())));
  return out;
}

}  // namespace

// Limits: route ids r = token·k + slot and the sentinel M·k are int32, so M·k < 2^31; E and b are
// bounded by 2^20 (a plan's vectors are allocated per expert and per block row).
ops::RouteAlignment alignment_from_json(const nlohmann::json& j, const std::string& where) {
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();
  ops::RouteAlignment a;
  MOESQ_CHECK(j.is_object(), where, ": not an alignment plan (expected a JSON object)");
  try {
    a.topk = static_cast<int>(get_int_in(j.at("topk"), where, "topk", 1, 1 << 20));
    a.M = get_int_in(j.at("M"), where, "M", 0, kMaxId / a.topk);
    a.num_experts = static_cast<int>(get_int_in(j.at("num_experts"), where, "num_experts", 1, 1 << 20));
    a.block_size = static_cast<int>(get_int_in(j.at("block_size"), where, "block_size", 1, 1 << 20));
    a.sorted_ids = get_ids(j, where, "sorted_ids");
    a.block_expert = get_ids(j, where, "block_expert");
  } catch (const nlohmann::json::exception& e) {
    MOESQ_FAIL(where, ": not an alignment plan (", e.what(), ")");
  }
  MOESQ_CHECK(a.padded_total() == a.num_blocks() * a.block_size, where, ": plan rows ", a.padded_total(),
              " != blocks ", a.num_blocks(), " × b ", a.block_size);
  return a;
}

nlohmann::json schedule_to_json(const ops::TileSchedule& s) {
  return {{"schedule", ops::schedule_kind_name(s.kind)},
          {"blocks", s.num_blocks},
          {"N", s.N},
          {"K", s.K},
          {"thread_k", s.thread_k},
          {"thread_n", s.thread_n},
          {"grid", s.grid},
          {"n_tiles", s.n_tiles},
          {"k_tiles", s.k_tiles},
          {"tiles", s.tiles},
          {"direct_tiles", s.direct_tiles},
          {"split_tiles", s.split_tiles},
          {"slices", s.slices},
          {"k_tiles_per_slice", s.k_tiles / s.slices},
          {"reduced", s.slices > 1},
          {"first_split_block", s.first_split_block}};
}

}  // namespace moesq::audit
