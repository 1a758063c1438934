// The audit self-test (audit.h): five clean replicate runs, then seven mutated copies, each of which the
// scorer must reject for its own reason. Non-obvious: the runs inject one captured native plan, because on
// the GPU the atomic order may change between calls and would (rightly) fail the replicate rule.
#include "audit/audit.h"

#include <filesystem>
#include <fstream>

#include "audit/audit_files.h"
#include "core/atomic_file.h"
#include "core/error.h"

namespace fs = std::filesystem;
using moesq::audit::detail::json_text;
using moesq::audit::detail::read_json;

namespace moesq::audit {

std::vector<std::string> audit_self_test(const std::string& work_dir, const AuditBackend& backend,
                                         const std::string& fixture_name, bool& passed) {
  std::vector<std::string> report;
  passed = true;
  fs::remove_all(work_dir);
  fs::create_directories(work_dir + "/clean");
  const AuditFixture fx = make_audit_fixture(fixture_name, 0);
  // The self-test checks the SCORER, so its runs inject one captured native plan: on the GPU the atomic
  // order can change from call to call, which would (rightly) fail the 5-identical-outcomes rule.
  const ops::RouteAlignment a = backend.align_native(fx, "H0");
  write_file_atomic(work_dir + "/plan.json", json_text(alignment_to_json(a), -1) + "\n");
  int64_t span = -1;  // first pair of blocks of one expert: exchange a route across them
  for (int64_t p = 0; p + 1 < a.num_blocks() && span < 0; ++p)
    if (a.block_expert[p] == a.block_expert[p + 1]) span = p;
  MOESQ_CHECK(span >= 0, "self-test: fixture has no expert spanning two blocks");
  AuditRunConfig cfg;
  cfg.cell = "exchange";
  cfg.fixture = fixture_name;
  cfg.device = backend.device;
  cfg.intervention = "exchange";
  cfg.plan_file = work_dir + "/plan.json";
  cfg.route_a = a.sorted_ids[span * a.block_size];
  cfg.route_b = a.sorted_ids[(span + 1) * a.block_size];
  std::vector<std::string> clean;
  for (int r = 0; r < 5; ++r) {
    cfg.replicate = r;
    clean.push_back(work_dir + "/clean/run" + std::to_string(r));
    audit_run(cfg, clean.back(), backend, &fx);
  }
  const BuildIdentity id = current_build_identity();
  const AuditVerdict base = audit_score(clean, id, 5);
  report.push_back(std::string("clean: ") + (base.ok ? "accepted" : "REJECTED (" + base.reason + ": " + base.detail + ")"));
  passed = passed && base.ok;

  auto edit_json = [](const std::string& path, const std::function<void(nlohmann::json&)>& fn, bool pretty) {
    nlohmann::json j = read_json(path);
    fn(j);
    std::ofstream(path) << (pretty ? json_text(j, 2) : json_text(j, -1)) << "\n";
  };
  struct Mutation {
    std::string name, reason;
    std::function<void(const std::string& run)> apply;
  };
  const int64_t last_block = a.num_blocks() - 1;
  const int b = a.block_size;
  const std::vector<Mutation> mutations = {
      {"route", "route",
       [&](const std::string& run) {  // a route of block 0 swapped with one of the last block (other experts)
         edit_json(run + "/plan.json", [&](nlohmann::json& j) {
           auto ids = j["sorted_ids"].get<std::vector<int32_t>>();
           std::swap(ids[0], ids[last_block * b]);
           j["sorted_ids"] = ids;
         }, false);
       }},
      {"expert block", "expert block",
       [&](const std::string& run) {
         edit_json(run + "/plan.json", [&](nlohmann::json& j) {
           auto be = j["block_expert"].get<std::vector<int32_t>>();
           be[0] = be[0] == 0 ? 1 : be[0] - 1;
           j["block_expert"] = be;
         }, false);
       }},
      {"treatment marker", "treatment",
       [&](const std::string& run) {
         edit_json(run + "/manifest.json", [](nlohmann::json& j) {
           j["config"]["intervention"] = "reorder";
           j["treatment"]["intervention"] = "reorder";
         }, true);
       }},
      {"grid marker", "grid",
       [&](const std::string& run) {
         edit_json(run + "/manifest.json", [](nlohmann::json& j) { j["config"]["grid"] = 200; }, true);
       }},
      {"stage hash", "stage hash",
       [&](const std::string& run) {
         edit_json(run + "/manifest.json", [](nlohmann::json& j) {
           std::string h = j["hashes"]["w13_out"].get<std::string>();
           h[0] = h[0] == '0' ? '1' : '0';
           j["hashes"]["w13_out"] = h;
         }, true);
       }},
      {"raw tensor", "raw tensor",
       [&](const std::string& run) {  // flip one bit of the last data byte (w2_out: tensors are stored in name order)
         std::fstream f(run + "/surfaces.safetensors", std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(-1, std::ios::end);
         char c;
         f.get(c);
         f.seekp(-1, std::ios::end);
         f.put(static_cast<char>(c ^ 0x01));
       }},
      {"source/binary identity", "identity",
       [&](const std::string& run) {
         edit_json(run + "/manifest.json", [](nlohmann::json& j) {
           std::string h = j["build"]["binary_sha256"].get<std::string>();
           h[5] = h[5] == 'a' ? 'b' : 'a';
           j["build"]["binary_sha256"] = h;
         }, true);
       }},
  };
  for (size_t i = 0; i < mutations.size(); ++i) {
    const auto& mu = mutations[i];
    const std::string dir = work_dir + "/mut" + std::to_string(i);
    std::vector<std::string> runs;
    for (int r = 0; r < 5; ++r) {
      runs.push_back(dir + "/run" + std::to_string(r));
      fs::create_directories(runs.back());  // copy target
      fs::copy(clean[r], runs.back(), fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    }
    mu.apply(runs[2]);  // mutate a middle replicate
    const AuditVerdict v = audit_score(runs, id, 5);
    const bool right = !v.ok && v.reason == mu.reason;
    passed = passed && right;
    report.push_back("mutation " + std::to_string(i + 1) + " (" + mu.name + "): " +
                     (v.ok ? std::string("ACCEPTED — scorer missed it")
                           : "rejected for '" + v.reason + "'" + (right ? "" : " — WRONG, expected '" + mu.reason + "'")) +
                     (v.ok ? "" : "  [" + v.detail + "]"));
  }
  return report;
}

}  // namespace moesq::audit
