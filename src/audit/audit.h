// `moesq audit`: reproduce paper 000 with moesq's own tools and check the cure.
//
// A RUN executes one AWQ MoE layer on a fixed fixture under a history (H0: nothing before; H1: three
// persistent tensors shaped like the inputs allocated and filled before the layer is built, never used
// by the operator — on the CPU backend the history seeds the emulated atomic order), an alignment
// order, a schedule and grid, an optional injected plan and an optional intervention, and writes:
//   surfaces.safetensors  the four raw fp16 surfaces (+ their SHA-256 in the file's metadata)
//   plan.json             the alignment plan the GEMMs consumed (after the intervention)
//   manifest.json         config, fixture identity, treatment (route positions before/after), the
//                         schedules the GEMMs consumed (grid marker), fingerprint, surface hashes,
//                         build identity (source commit, SHA-256 of the binary)
// The SCORER trusts none of it: it reloads the raw tensors, recomputes every hash, validates the plan
// against the fixture's top-k ids, recomputes membership and the schedule from the declared grid,
// checks the treatment really moved the declared routes, and requires 5 identical outcomes per
// (cell, history). Every rejection carries one reason code (see AuditReason).
// The one non-obvious decision: each surface hash is recorded twice (manifest and the raw file's own
// metadata), so the scorer can tell a tampered stage hash (the two records disagree) from a corrupted
// raw tensor (the records agree, the bytes do not).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/route_align/route_align.h"
#include "audit/awq_layer.h"
#include "audit/build_identity.h"
#include "audit/plan_json.h"
#include "ops/awq_gemm/awq_schedule.h"

namespace moesq::audit {

// The fixed inputs of an audit: routing fixture of paper 000 (M = 21, k = 8, E = 128, b = 8) with
// layer shapes "qwen3" (H = 2048, I = 768: W13 N = 1536, K = 2048; W2 N = 2048, K = 768) or "small"
// (H = 512, I = 128, for fast CLI tests); synthetic AWQ weights, inputs and router weights from `seed`.
struct AuditFixture {
  std::string name;
  uint64_t seed = 0;
  int64_t M = 0;
  int topk = 0, num_experts = 0, block_size = 0;
  std::vector<int32_t> topk_ids;     // [M, k]
  std::vector<float> topk_weights;   // [M, k]
  std::vector<uint16_t> x;           // [M, H] fp16
  AwqMoeWeights weights;             // loaded for the active experts only (when requested)
  std::string identity() const;      // SHA-256 over name, seed, ids, router weights and x
};
AuditFixture make_audit_fixture(const std::string& name, uint64_t seed, bool with_weights = true);

struct AuditRunConfig {
  std::string cell = "native";      // label of the experimental cell
  std::string history = "H0";       // H0 | H1
  ops::AlignOrder align = ops::AlignOrder::Native;
  ops::ScheduleKind schedule = ops::ScheduleKind::Native;
  int64_t grid = 246;
  ops::ThreadConfigOverrides overrides;
  std::string plan_file;            // injected plan (a plan.json of another run); "" = align here
  std::string intervention = "none";  // none | reorder | exchange
  int32_t route_a = -1, route_b = -1;
  std::string fixture = "qwen3";
  uint64_t seed = 0;
  std::string device = "cpu";
  int replicate = 0;
  nlohmann::json to_json() const;
};

// What differs between the CPU and CUDA backends: the native alignment (atomics on the GPU) and the
// GEMM/layer. `prepare_history` runs before anything else (H1's persistent tensors on the GPU).
struct AuditBackend {
  std::string device = "cpu";
  std::function<void(const std::string& history, const AuditFixture&)> prepare_history;
  std::function<ops::RouteAlignment(const AuditFixture&, const std::string& history)> align_native;
  std::function<LayerSurfaces(const AuditFixture&, const ops::RouteAlignment&, const LayerRunSpec&)> run_layer;
  std::function<void()> release_history;
};
AuditBackend cpu_audit_backend();
uint64_t history_seed(const std::string& history);  // H0 → 0, H1 → 1; Error names --history otherwise

// Runs one audit run into `out_dir` (atomic: nothing is left on failure). Returns the manifest.
nlohmann::json audit_run(const AuditRunConfig& cfg, const std::string& out_dir, const AuditBackend& backend,
                         const AuditFixture* fixture = nullptr);

// Scoring. Reasons are stable strings so tests and the self-test can check WHY a run was rejected.
struct AuditVerdict {
  bool ok = true;
  std::string reason;   // "" | identity | route | expert block | fingerprint | treatment | grid |
                        // stage hash | raw tensor | replicates | unreadable
  std::string detail;   // the message
  nlohmann::json summary;  // per-cell hashes and the outcome table
};
// Scores the run directories (each holding manifest.json). `scorer`: the scorer's build identity — every
// run must carry its binary SHA-256, and all runs the same source commit (that of the first run).
// `replicates`: identical outcomes required per (cell, history); a directory listed twice (under any
// spelling) is rejected with reason "replicates", since it is one replicate, not two.
AuditVerdict audit_score(const std::vector<std::string>& run_dirs, const BuildIdentity& scorer,
                         int replicates = 5);
// Applies the 7 mutations to copies of 5 clean replicate runs of `fixture`, and checks each is rejected
// for its stated reason; returns the report lines; `passed` = clean accepted and all 7 rejected right.
std::vector<std::string> audit_self_test(const std::string& work_dir, const AuditBackend& backend,
                                         const std::string& fixture, bool& passed);

// The study of paper 000: cells native, inject-own, inject-cross, reorder, exchange, grid200,
// canonical, canonical-invariant × histories H0/H1 × `replicates`, replicate-major with the history
// order alternated by replicate; then scores it and writes outcomes.md + score.json under `root`.
AuditVerdict audit_study(const std::string& root, const AuditBackend& backend, const std::string& fixture,
                         uint64_t seed, int replicates);

}  // namespace moesq::audit
