// `moesq audit` — make route-block membership visible, testable and harmless (DESIGN.md §6, paper 000).
//   audit schedule   which MoE blocks run direct/full-K and which split-K (+ --json)
//   audit run        one AWQ MoE layer run under a history/schedule/grid/plan/intervention → raw surfaces
//   audit score      reload, recompute, validate; 5 identical outcomes per cell/history; --self-test
//   audit study      the whole paper-000 matrix (cells × H0/H1 × replicates), scored, with outcome tables
// The CLI is thin: flags → ops::audit_* / ops::make_schedule. Non-obvious: `--device cuda` swaps only
// the backend (native alignment + GEMM), so CPU and GPU runs are scored by the same code.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "audit/audit.h"
#include "ops/awq_gemm/awq_schedule.h"
#if defined(MOESQ_HAVE_CUDA) && __has_include("audit/awq_backend.h")
#include "audit/awq_backend.h"
#define MOESQ_AUDIT_CUDA 1
#endif

namespace moesq::cli {

namespace {

audit::AuditBackend backend_for(const std::string& device) {
  if (device == "cpu") return audit::cpu_audit_backend();
#ifdef MOESQ_AUDIT_CUDA
  if (device == "cuda") return moesq::audit::cuda_audit_backend();
#endif
  MOESQ_FAIL("--device: '", device, "' is not available in this build (cpu",
#ifdef MOESQ_AUDIT_CUDA
             ", cuda",
#endif
             ")");
}

std::vector<std::string> expand_run_dirs(const std::vector<std::string>& args) {
  // A directory holding manifest.json is a run; otherwise every sub-directory holding one is.
  std::vector<std::string> out;
  for (const auto& a : args) {
    namespace fs = std::filesystem;
    MOESQ_CHECK(fs::is_directory(a), "audit score: ", a, " is not a directory");
    if (fs::exists(fs::path(a) / "manifest.json")) {
      out.push_back(a);
      continue;
    }
    std::vector<std::string> sub;
    for (const auto& e : fs::recursive_directory_iterator(a))
      if (e.is_regular_file() && e.path().filename() == "manifest.json") sub.push_back(e.path().parent_path().string());
    std::sort(sub.begin(), sub.end());
    MOESQ_CHECK(!sub.empty(), "audit score: no run (manifest.json) under ", a);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

}  // namespace

void register_audit(CLI::App& app) {
  auto* cmd = app.add_subcommand("audit", "Route-block membership audit of the packed-AWQ MoE GEMM (paper 000)");
  cmd->require_subcommand(1);

  // ---- schedule ----
  struct ScheduleOpts {
    int64_t blocks = 50, N = 1536, K = 2048, grid = 246;
    int thread_k = 0, thread_n = 0;
    std::string schedule = "native";
    bool json = false;
  };
  auto so = std::make_shared<ScheduleOpts>();
  auto* sc = cmd->add_subcommand("schedule", "Print which MoE blocks are direct (full-K) and which split-K");
  sc->add_option("--blocks", so->blocks, "MoE blocks P")->capture_default_str();
  sc->add_option("--n", so->N, "output columns N")->capture_default_str();
  sc->add_option("--k", so->K, "contraction K")->capture_default_str();
  sc->add_option("--thread-k", so->thread_k, "K per K-tile (0 = selector)");
  sc->add_option("--thread-n", so->thread_n, "N per N-tile (0 = selector)");
  sc->add_option("--grid", so->grid, "CUDA blocks G")->capture_default_str();
  sc->add_option("--schedule", so->schedule, "native | invariant | invariant-split")->capture_default_str();
  sc->add_flag("--json", so->json, "print JSON");
  sc->callback([so] {
    ops::ThreadConfigOverrides ov;
    ov.thread_k = so->thread_k;
    ov.thread_n = so->thread_n;
    const auto tc = ops::select_thread_config(so->N, so->K, ov);
    const auto s = ops::make_schedule(ops::parse_schedule_kind(so->schedule), so->blocks, so->N, so->K, tc.thread_k,
                                      tc.thread_n, so->grid);
    if (so->json) std::cout << audit::schedule_to_json(s).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    else std::cout << s.table();
  });

  // ---- run ----
  auto ro = std::make_shared<audit::AuditRunConfig>();
  auto align = std::make_shared<std::string>("native");
  auto sched = std::make_shared<std::string>("native");
  auto out = std::make_shared<std::string>();
  auto routes = std::make_shared<std::vector<int32_t>>();
  auto* rn = cmd->add_subcommand("run", "Run one AWQ MoE layer and write raw surfaces, hashes, plan, config, build identity");
  rn->add_option("--out", *out, "output run directory (written atomically)")->required();
  rn->add_option("--history", ro->history, "H0 | H1")->capture_default_str();
  rn->add_option("--align", *align, "native | canonical")->capture_default_str();
  rn->add_option("--schedule", *sched, "native | invariant | invariant-split")->capture_default_str();
  rn->add_option("--grid", ro->grid, "CUDA blocks G of both GEMMs")->capture_default_str();
  rn->add_option("--thread-k", ro->overrides.thread_k, "override thread_k");
  rn->add_option("--thread-n", ro->overrides.thread_n, "override thread_n");
  rn->add_option("--plan", ro->plan_file, "inject an alignment plan (plan.json of another run)");
  rn->add_option("--intervention", ro->intervention, "none | reorder | exchange")->capture_default_str();
  rn->add_option("--routes", *routes, "the two route ids of the intervention")->expected(2);
  rn->add_option("--fixture", ro->fixture, "qwen3 | small")->capture_default_str();
  rn->add_option("--seed", ro->seed, "fixture seed")->capture_default_str();
  rn->add_option("--device", ro->device, "cpu | cuda")->capture_default_str();
  rn->add_option("--cell", ro->cell, "cell label recorded in the manifest")->capture_default_str();
  rn->add_option("--replicate", ro->replicate, "replicate index recorded in the manifest");
  rn->callback([ro, align, sched, out, routes] {
    ro->align = ops::parse_align_order(*align);
    ro->schedule = ops::parse_schedule_kind(*sched);
    if (ro->intervention != "none") {
      MOESQ_CHECK(routes->size() == 2, "--intervention ", ro->intervention, " needs --routes A B");
      ro->route_a = (*routes)[0];
      ro->route_b = (*routes)[1];
    }
    const auto m = audit::audit_run(*ro, *out, backend_for(ro->device));
    std::cout << "wrote " << *out << "\n";
    for (auto& [k, v] : m["hashes"].items()) std::cout << "  " << k << " " << v.get<std::string>() << "\n";
    std::cout << "  fingerprint " << m["fingerprint"].get<std::string>() << "\n";
  });

  // ---- score ----
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto self_test = std::make_shared<bool>(false);
  auto reps = std::make_shared<int>(5);
  auto st_fixture = std::make_shared<std::string>("small");
  auto st_device = std::make_shared<std::string>("cpu");
  auto st_work = std::make_shared<std::string>();
  auto* scr = cmd->add_subcommand("score", "Re-validate runs: hashes, membership, treatment, grid, replicates");
  scr->add_option("runs", *dirs, "run directories (or folders containing them)");
  scr->add_option("--replicates", *reps, "identical outcomes required per cell/history")->capture_default_str()->check(CLI::Range(1, 1000));
  scr->add_flag("--self-test", *self_test, "apply the 7 mutations and require each rejected for its reason");
  scr->add_option("--fixture", *st_fixture, "fixture of the self-test runs")->capture_default_str();
  scr->add_option("--device", *st_device, "device of the self-test runs")->capture_default_str();
  scr->add_option("--work", *st_work, "self-test scratch directory (default: a temp dir)");
  scr->callback([dirs, self_test, reps, st_fixture, st_device, st_work] {
    if (*self_test) {
      const std::string work = st_work->empty()
                                   ? (std::filesystem::temp_directory_path() / ("moesq-audit-selftest-" + std::to_string(::getpid()))).string()
                                   : *st_work;
      bool passed = false;
      const auto lines = audit::audit_self_test(work, backend_for(*st_device), *st_fixture, passed);
      for (const auto& l : lines) std::cout << l << "\n";
      if (st_work->empty()) std::filesystem::remove_all(work);
      std::cout << (passed ? "self-test PASSED: all 7 mutations rejected for their stated reason\n" : "self-test FAILED\n");
      if (!passed) throw CLI::RuntimeError(1);
      return;
    }
    MOESQ_CHECK(!dirs->empty(), "audit score: give run directories, or --self-test");
    const auto v = audit::audit_score(expand_run_dirs(*dirs), audit::current_build_identity(), *reps);
    if (!v.ok) {
      std::cout << "REJECTED (" << v.reason << "): " << v.detail << "\n";
      throw CLI::RuntimeError(1);
    }
    std::cout << v.summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  });

  // ---- study ----
  auto so2 = std::make_shared<audit::AuditRunConfig>();
  auto root = std::make_shared<std::string>();
  auto sreps = std::make_shared<int>(5);
  auto* sd = cmd->add_subcommand("study", "Run the paper-000 matrix (cells × H0/H1 × replicates) and score it");
  sd->add_option("--out", *root, "study root directory")->required();
  sd->add_option("--fixture", so2->fixture, "qwen3 | small")->capture_default_str();
  sd->add_option("--seed", so2->seed, "fixture seed")->capture_default_str();
  sd->add_option("--device", so2->device, "cpu | cuda")->capture_default_str();
  sd->add_option("--replicates", *sreps, "replicates per cell/history")->capture_default_str()->check(CLI::Range(1, 1000));
  sd->callback([so2, root, sreps] {
    const auto v = audit::audit_study(*root, backend_for(so2->device), so2->fixture, so2->seed, *sreps);
    std::cout << "wrote " << *root << "/outcomes.md and score.json\n";
    if (!v.ok) {
      std::cout << "REJECTED (" << v.reason << "): " << v.detail << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace moesq::cli
