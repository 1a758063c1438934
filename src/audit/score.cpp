// The audit scorer (audit.h). Non-obvious: it checks in a fixed order (identity → plan → fingerprint →
// treatment → grid → hashes → replicates) so that each of the seven self-test mutations is caught by
// exactly the check that names its reason.
#include "audit/audit.h"

#include <filesystem>
#include <map>

#include "audit/audit_files.h"
#include "core/error.h"
#include "core/hash.h"
#include "io/safetensors.h"

using moesq::audit::detail::kSurfaceNames;
using moesq::audit::detail::read_json;

namespace moesq::audit {

namespace {

struct Rejection {
  std::string reason, detail;
};

// Scores one run; returns the recomputed hashes (name → sha) or throws Rejection.
std::map<std::string, std::string> score_one(const std::string& dir, const BuildIdentity& expect,
                                             nlohmann::json& manifest_out) {
  nlohmann::json m;
  try {
    m = read_json(dir + "/manifest.json");
  } catch (const Error& e) {
    throw Rejection{"unreadable", e.what()};
  }
  manifest_out = m;
  try {
    const auto& b = m.at("build");
    // The binary must be the scorer's own; the source commit must be the one every run of the set
    // recorded (expect.git_commit is filled from the first run by audit_score).
    if (b.at("git_commit").get<std::string>() != expect.git_commit || b.at("binary_sha256").get<std::string>() != expect.binary_sha256)
      throw Rejection{"identity", dir + ": build identity " + b.at("git_commit").get<std::string>() + " / " +
                                      b.at("binary_sha256").get<std::string>() + " is not the expected " +
                                      expect.git_commit + " / " + expect.binary_sha256};
    const auto& c = m.at("config");
    const AuditFixture fx = make_audit_fixture(c.at("fixture").get<std::string>(), c.at("seed").get<uint64_t>(), false);
    if (m.at("fixture").at("identity").get<std::string>() != fx.identity())
      throw Rejection{"fixture", dir + ": fixture identity differs from the regenerated fixture"};
    ops::RouteAlignment plan;
    try {
      plan = alignment_from_json(read_json(dir + "/plan.json"), dir + "/plan.json");
    } catch (const Error& e) {
      throw Rejection{"unreadable", e.what()};
    }
    try {
      ops::validate_alignment(plan, fx.topk_ids);
    } catch (const Error& e) {
      const std::string msg = e.what();
      throw Rejection{msg.rfind("expert block:", 0) == 0 ? "expert block" : "route", dir + "/plan.json: " + msg};
    }
    if (ops::route_block_fingerprint(plan) != m.at("fingerprint").get<std::string>())
      throw Rejection{"fingerprint", dir + ": recomputed membership fingerprint differs from the manifest"};
    // Treatment: the declared intervention must be visible in the plan.
    const std::string iv = c.at("intervention").get<std::string>();
    const auto& t = m.at("treatment");
    if (iv == "none") {
      if (!t.at("routes").empty() || t.at("intervention").get<std::string>() != "none")
        throw Rejection{"treatment", dir + ": config says no intervention but the treatment record moved routes"};
      if (c.at("plan_file").get<std::string>().empty() && c.at("align").get<std::string>() == "canonical") {
        const auto canon = ops::align_routes(fx.topk_ids, fx.M, fx.topk, fx.num_experts, fx.block_size, ops::AlignOrder::Canonical);
        if (canon.sorted_ids != plan.sorted_ids)
          throw Rejection{"treatment", dir + ": canonical alignment declared but the plan is not canonical"};
      }
    } else {
      const int32_t ra = c.at("route_a").get<int32_t>(), rb = c.at("route_b").get<int32_t>();
      if (t.at("intervention").get<std::string>() != iv || t.at("routes") != nlohmann::json({ra, rb}))
        throw Rejection{"treatment", dir + ": treatment record does not match the declared intervention " + iv};
      const int64_t row_a0 = t.at("before")[0].at("row").get<int64_t>(), row_b0 = t.at("before")[1].at("row").get<int64_t>();
      const ops::RoutePosition pa = ops::find_route(plan, ra), pb = ops::find_route(plan, rb);
      if (pa.row != row_b0 || pb.row != row_a0)
        throw Rejection{"treatment", dir + ": routes " + std::to_string(ra) + "/" + std::to_string(rb) +
                                         " were not swapped in the consumed plan"};
      const bool same_block = pa.block == pb.block;
      if ((iv == "reorder") != same_block)
        throw Rejection{"treatment", dir + ": " + iv + " of routes " + std::to_string(ra) + "/" + std::to_string(rb) +
                                         (same_block ? " inside one block" : " across blocks " +
                                          std::to_string(pa.block) + "/" + std::to_string(pb.block)) +
                                         " is not what the intervention means"};
    }
    // Grid: recompute the schedules the declared grid implies; they must equal the consumed ones.
    LayerRunSpec spec;
    spec.schedule = ops::parse_schedule_kind(c.at("schedule").get<std::string>());
    spec.grid = c.at("grid").get<int64_t>();
    spec.overrides.thread_k = c.at("thread_k").get<int>();
    spec.overrides.thread_n = c.at("thread_n").get<int>();
    const auto [s13, s2] = layer_schedules(fx.weights, plan, spec);
    if (m.at("schedule").at("w13") != schedule_to_json(s13) || m.at("schedule").at("w2") != schedule_to_json(s2))
      throw Rejection{"grid", dir + ": the consumed schedule is not the one grid " + std::to_string(spec.grid) +
                                  " (" + ops::schedule_kind_name(spec.schedule) + ") implies"};
    // Hashes: manifest vs the raw file's own record vs recomputed bytes.
    std::map<std::string, std::string> got;
    io::SafetensorsFile f(dir + "/surfaces.safetensors");
    for (const char* name : kSurfaceNames) {
      const std::string rec = m.at("hashes").at(name).get<std::string>();
      const auto it = f.metadata().find(std::string("sha256.") + name);
      const std::string file_rec = it == f.metadata().end() ? "" : it->second;
      if (rec != file_rec)
        throw Rejection{"stage hash", dir + ": recorded " + name + " hash " + rec + " disagrees with the raw file's " + file_rec};
      const io::TensorView& v = f.get(name);
      const std::string h = sha256_hex(v.data, v.nbytes);
      if (h != rec) throw Rejection{"raw tensor", dir + ": raw " + name + " hashes to " + h + ", recorded " + rec};
      got[name] = h;
    }
    return got;
  } catch (const Rejection&) {
    throw;
  } catch (const std::exception& e) {
    throw Rejection{"unreadable", dir + ": " + e.what()};
  }
}

}  // namespace

AuditVerdict audit_score(const std::vector<std::string>& run_dirs, const BuildIdentity& scorer, int replicates) {
  AuditVerdict v;
  BuildIdentity expect = scorer;
  if (!run_dirs.empty()) {  // source commit: the first run's (all runs must agree); binary: the scorer's
    try {
      expect.git_commit = read_json(run_dirs[0] + "/manifest.json").at("build").at("git_commit").get<std::string>();
    } catch (const std::exception&) {
    }
  }
  struct Group {
    std::map<std::string, std::string> hashes;
    std::string fingerprint;
    int count = 0;
    bool consistent = true;
  };
  std::map<std::string, std::map<std::string, Group>> cells;  // cell → history → group
  // One directory is one replicate: `audit score R R R R R` (or R, ./R, R/.) accepted a single run
  // as 5 identical replicates. Paths are compared resolved (symlinks, `.`, trailing `/`).
  std::map<std::string, std::string> seen;  // resolved path → as given
  for (const auto& dir : run_dirs) {
    std::error_code ec;
    const std::filesystem::path resolved = std::filesystem::weakly_canonical(dir, ec);
    const auto [it, fresh] = seen.emplace(ec ? dir : resolved.string(), dir);
    if (!fresh) {
      v.ok = false;
      v.reason = "replicates";
      v.detail = "run " + dir + " is listed twice (also as " + it->second + "): a run counts as one replicate";
      return v;
    }
  }
  for (const auto& dir : run_dirs) {
    nlohmann::json m;
    std::map<std::string, std::string> h;
    try {
      h = score_one(dir, expect, m);
    } catch (const Rejection& r) {
      v.ok = false;
      v.reason = r.reason;
      v.detail = r.detail;
      return v;
    }
    Group& g = cells[m["config"]["cell"].get<std::string>()][m["config"]["history"].get<std::string>()];
    if (g.count == 0) {
      g.hashes = h;
      g.fingerprint = m["fingerprint"].get<std::string>();
    } else if (g.hashes != h || g.fingerprint != m["fingerprint"].get<std::string>()) {
      g.consistent = false;
    }
    ++g.count;
  }
  nlohmann::json cells_json = nlohmann::json::object();
  for (auto& [cell, hist] : cells)
    for (auto& [h, g] : hist) {
      if ((!g.consistent || g.count < replicates) && v.ok) {  // first failing group names the rejection
        v.ok = false;
        v.reason = "replicates";
        v.detail = "cell " + cell + " / " + h + ": " + std::to_string(g.count) + " runs, " +
                   (g.consistent ? "identical" : "NOT identical") + ", " + std::to_string(replicates) +
                   " identical required";
      }
      cells_json[cell][h] = {{"runs", g.count}, {"identical", g.consistent}, {"fingerprint", g.fingerprint},
                             {"hashes", g.hashes}};
    }
  // Outcome table: H0 vs H1 inside each cell, and each cell vs the native cell of the same history.
  nlohmann::json table = nlohmann::json::array();
  for (auto& [cell, hist] : cells) {
    nlohmann::json row = {{"cell", cell}};
    if (hist.count("H0") && hist.count("H1"))
      for (const char* s : kSurfaceNames)
        row["H0_vs_H1"][s] = hist["H0"].hashes[s] == hist["H1"].hashes[s] ? "equal" : "differ";
    if (cells.count("native") && cell != "native")
      for (auto& [h, g] : hist)
        if (cells["native"].count(h))
          for (const char* s : kSurfaceNames) {
            const auto& other = cells["native"][h].hashes[s];
            const std::string opp = h == "H0" ? "H1" : "H0";
            std::string rel = g.hashes[s] == other ? "same as native " + h : "differs from native " + h;
            if (g.hashes[s] != other && cells["native"].count(opp) && cells["native"][opp].hashes[s] == g.hashes[s])
              rel = "same as native " + opp;
            row["vs_native"][h][s] = rel;
          }
    table.push_back(row);
  }
  v.summary = {{"build", {{"git_commit", expect.git_commit}, {"binary_sha256", expect.binary_sha256}}},
               {"cells", cells_json}, {"outcomes", table}, {"runs", run_dirs.size()}, {"replicates", replicates}};
  return v;
}

}  // namespace moesq::audit
