// JSON forms of alignment plans and tile schedules (plan_json.h).
#include "audit/plan_json.h"

#include "core/error.h"

namespace moesq::moe {

nlohmann::json alignment_to_json(const RouteAlignment& a) {
  return {{"M", a.M},
          {"topk", a.topk},
          {"num_experts", a.num_experts},
          {"block_size", a.block_size},
          {"padded_total", a.padded_total()},
          {"num_blocks", a.num_blocks()},
          {"sorted_ids", a.sorted_ids},
          {"block_expert", a.block_expert}};
}

RouteAlignment alignment_from_json(const nlohmann::json& j, const std::string& where) {
  RouteAlignment a;
  try {
    a.M = j.at("M").get<int64_t>();
    a.topk = j.at("topk").get<int>();
    a.num_experts = j.at("num_experts").get<int>();
    a.block_size = j.at("block_size").get<int>();
    a.sorted_ids = j.at("sorted_ids").get<std::vector<int32_t>>();
    a.block_expert = j.at("block_expert").get<std::vector<int32_t>>();
  } catch (const nlohmann::json::exception& e) {
    MOESQ_FAIL(where, ": not an alignment plan (", e.what(), ")");
  }
  MOESQ_CHECK(a.block_size > 0 && a.padded_total() == a.num_blocks() * a.block_size, where,
              ": plan rows ", a.padded_total(), " != blocks ", a.num_blocks(), " × b ", a.block_size);
  return a;
}

nlohmann::json schedule_to_json(const TileSchedule& s) {
  return {{"schedule", schedule_kind_name(s.kind)},
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

}  // namespace moesq::moe
