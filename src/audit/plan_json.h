// JSON forms of the plain-data values an audit run records: the alignment plan (plan.json, injectable
// into another run) and the tile schedule (the manifest's "grid marker"). JSON lives here, not in ops.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "ops/awq_gemm/awq_schedule.h"
#include "ops/route_align/route_align.h"

namespace moesq::audit {

nlohmann::json alignment_to_json(const ops::RouteAlignment& a);
ops::RouteAlignment alignment_from_json(const nlohmann::json& j, const std::string& where);  // Error names `where`

nlohmann::json schedule_to_json(const ops::TileSchedule& s);

}  // namespace moesq::audit
