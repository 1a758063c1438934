// libFuzzer target: the audit's alignment plan JSON (audit/plan_json.h), the file `moesq audit run
// --plan` injects and `audit score` re-reads, then what both do with it: validate it against the
// paper-000 fixture's top-k ids, and, when valid, fingerprint it, locate routes and apply the two
// interventions. Contract: a moesq::Error (malformed JSON is a parse error) — never a crash, a
// sanitizer report, an nlohmann exception or std::length_error escaping.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "audit/plan_json.h"
#include "core/error.h"
#include "ops/route_align/route_align.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<int32_t> topk_ids = moesq::ops::make_fixture_topk_ids(0);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {  // parse_error, or out_of_range for 1e400 (as the readers do)
    return 0;
  }
  try {
    moesq::ops::RouteAlignment a = moesq::audit::alignment_from_json(j, "fuzz/plan.json");
    (void)moesq::audit::alignment_to_json(a).dump();
    moesq::ops::validate_alignment(a, topk_ids);
    (void)moesq::ops::route_block_fingerprint(a);
    const int32_t r1 = static_cast<int32_t>(size % 168), r2 = static_cast<int32_t>((size * 7 + 3) % 168);
    (void)moesq::ops::find_route(a, r1);
    moesq::ops::RouteAlignment b = a;
    try {
      moesq::ops::intervene_reorder(b, r1, r2);
    } catch (const moesq::Error&) {
    }
    moesq::ops::intervene_exchange(a, r1, r2);
  } catch (const moesq::Error&) {
  }
  return 0;
}
