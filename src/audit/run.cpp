// One audit run (audit.h): fixture → history → plan (computed, injected, intervened) → layer → the run
// directory (surfaces.safetensors, plan.json, manifest.json), written atomically. Also the CPU backend.
#include "audit/audit.h"

#include "audit/audit_files.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/hash.h"
#include "io/safetensors.h"

using moesq::audit::detail::json_text;
using moesq::audit::detail::read_json;

namespace moesq::audit {

namespace {

nlohmann::json position_json(const ops::RoutePosition& p) { return {{"row", p.row}, {"block", p.block}}; }

}  // namespace

nlohmann::json AuditRunConfig::to_json() const {
  return {{"cell", cell},
          {"history", history},
          {"align", ops::align_order_name(align)},
          {"schedule", ops::schedule_kind_name(schedule)},
          {"grid", grid},
          {"thread_k", overrides.thread_k},
          {"thread_n", overrides.thread_n},
          {"plan_file", plan_file},
          {"intervention", intervention},
          {"route_a", route_a},
          {"route_b", route_b},
          {"fixture", fixture},
          {"seed", seed},
          {"device", device},
          {"replicate", replicate}};
}

uint64_t history_seed(const std::string& history) {
  if (history == "H0") return 0;
  if (history == "H1") return 1;
  MOESQ_FAIL("--history: unknown history '", history, "' (expected H0 or H1)");
}

AuditBackend cpu_audit_backend() {
  AuditBackend b;
  b.device = "cpu";
  b.prepare_history = [](const std::string& h, const AuditFixture&) { history_seed(h); };
  b.align_native = [](const AuditFixture& f, const std::string& h) {
    return ops::align_routes(f.topk_ids, f.M, f.topk, f.num_experts, f.block_size, ops::AlignOrder::Native, history_seed(h));
  };
  b.run_layer = [](const AuditFixture& f, const ops::RouteAlignment& a, const LayerRunSpec& spec) {
    return run_awq_moe_layer(f.x, f.topk_weights, a, f.weights, spec);
  };
  b.release_history = [] {};
  return b;
}

nlohmann::json audit_run(const AuditRunConfig& cfg, const std::string& out_dir, const AuditBackend& backend,
                         const AuditFixture* fixture) {
  history_seed(cfg.history);
  MOESQ_CHECK(cfg.device == backend.device, "--device ", cfg.device, " but the backend is ", backend.device);
  AuditFixture own;
  if (!fixture) {
    own = make_audit_fixture(cfg.fixture, cfg.seed);
    fixture = &own;
  }
  MOESQ_CHECK(fixture->name == cfg.fixture && fixture->seed == cfg.seed, "audit run: fixture ", fixture->name, "/",
              fixture->seed, " does not match --fixture ", cfg.fixture, " --seed ", cfg.seed);
  backend.prepare_history(cfg.history, *fixture);  // H1: persistent tensors before the layer is built
  struct Release {
    const AuditBackend& b;
    ~Release() { b.release_history(); }
  } release{backend};

  ops::RouteAlignment plan;
  std::string plan_source = "computed";
  if (!cfg.plan_file.empty()) {
    plan = alignment_from_json(read_json(cfg.plan_file), "--plan " + cfg.plan_file);
    plan_source = "injected:" + sha256_file(cfg.plan_file);
  } else if (cfg.align == ops::AlignOrder::Native) {
    plan = backend.align_native(*fixture, cfg.history);
  } else {
    plan = ops::align_routes(fixture->topk_ids, fixture->M, fixture->topk, fixture->num_experts, fixture->block_size,
                        ops::AlignOrder::Canonical);
  }
  ops::validate_alignment(plan, fixture->topk_ids);
  const std::string base_fp = ops::route_block_fingerprint(plan);
  nlohmann::json treatment = {{"intervention", cfg.intervention}, {"routes", nlohmann::json::array()}};
  if (cfg.intervention != "none") {
    MOESQ_CHECK(cfg.intervention == "reorder" || cfg.intervention == "exchange", "--intervention: unknown '",
                cfg.intervention, "' (expected none, reorder or exchange)");
    const ops::RoutePosition pa = ops::find_route(plan, cfg.route_a), pb = ops::find_route(plan, cfg.route_b);
    if (cfg.intervention == "reorder") ops::intervene_reorder(plan, cfg.route_a, cfg.route_b);
    else ops::intervene_exchange(plan, cfg.route_a, cfg.route_b);
    treatment["routes"] = {cfg.route_a, cfg.route_b};
    treatment["before"] = {position_json(pa), position_json(pb)};
    treatment["after"] = {position_json(ops::find_route(plan, cfg.route_a)), position_json(ops::find_route(plan, cfg.route_b))};
  }
  LayerRunSpec spec;
  spec.schedule = cfg.schedule;
  spec.grid = cfg.grid;
  spec.overrides = cfg.overrides;
  const auto [s13, s2] = layer_schedules(fixture->weights, plan, spec);
  const LayerSurfaces out = backend.run_layer(*fixture, plan, spec);

  nlohmann::json hashes;
  io::SafetensorsWriter w;
  for (const auto& s : out.surfaces) {
    hashes[s.name] = s.sha256();
    w.add(s.name, io::DType::F16, s.shape, s.data.data(), s.data.size() * 2);
    w.set_metadata("sha256." + s.name, s.sha256());
  }
  const BuildIdentity id = current_build_identity();
  nlohmann::json manifest = {
      {"config", cfg.to_json()},
      {"fixture", {{"name", fixture->name}, {"seed", fixture->seed}, {"identity", fixture->identity()}}},
      {"plan_source", plan_source},
      {"base_fingerprint", base_fp},
      {"fingerprint", ops::route_block_fingerprint(plan)},
      {"treatment", treatment},
      {"schedule", {{"w13", schedule_to_json(s13)}, {"w2", schedule_to_json(s2)}}},
      {"hashes", hashes},
      {"build", {{"git_commit", id.git_commit}, {"binary_sha256", id.binary_sha256}}}};
  // manifest.json marks an earlier run (re-running into it replaces it; `audit study` re-run into
  // the same root did not work); an injected plan inside out_dir is an input and is refused.
  AtomicDir dir(out_dir, "--out", "manifest.json",
                cfg.plan_file.empty() ? std::vector<std::string>{} : std::vector<std::string>{cfg.plan_file});
  w.write(dir.path() + "/surfaces.safetensors");
  write_file_atomic(dir.path() + "/plan.json", json_text(alignment_to_json(plan), -1) + "\n");
  write_file_atomic(dir.path() + "/manifest.json", json_text(manifest, 2) + "\n");
  dir.commit();
  return manifest;
}

}  // namespace moesq::audit
