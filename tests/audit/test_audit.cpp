// Audit library on the small fixture: canonical alignment + invariant schedule give one outcome for H0
// and H1 across grids (the cure), and the scorer's replicate rule rejects a group whose runs disagree.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "audit/audit.h"

using namespace moesq::audit;
using namespace moesq::format;
using namespace moesq::ops;
namespace fs = std::filesystem;

TEST(Audit, CanonicalInvariantOneOutcomeAndReplicateRule) {
  const fs::path root = fs::temp_directory_path() / ("moesq_audit_lib_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const AuditBackend cpu = cpu_audit_backend();
  const AuditFixture fx = make_audit_fixture("small", 3);
  std::vector<std::string> dirs;
  AuditRunConfig c;
  c.cell = "canonical-invariant";
  c.align = AlignOrder::Canonical;
  c.schedule = ScheduleKind::Invariant;
  c.fixture = "small";
  c.seed = 3;
  for (const char* h : {"H0", "H1"})
    for (int r = 0; r < 3; ++r) {
      c.history = h;
      c.replicate = r;
      c.grid = 50 + 17 * r;  // the grid must not matter under the invariant schedule
      dirs.push_back((root / (std::string(h) + "-r" + std::to_string(r))).string());
      audit_run(c, dirs.back(), cpu, &fx);
    }
  AuditVerdict v = audit_score(dirs, current_build_identity(), 3);
  ASSERT_TRUE(v.ok) << v.reason << ": " << v.detail;
  const auto& cells = v.summary["cells"]["canonical-invariant"];
  EXPECT_EQ(cells["H0"]["hashes"], cells["H1"]["hashes"]);
  EXPECT_EQ(v.summary["outcomes"][0]["H0_vs_H1"]["final"], "equal");
  // A native-schedule run carrying the same cell label disagrees with its group: rejected.
  AuditRunConfig n = c;
  n.align = AlignOrder::Native;
  n.schedule = ScheduleKind::Native;
  n.grid = 20;  // 50 blocks × 2 N-tiles = 100 tiles: the last wave is split
  n.history = "H0";
  n.replicate = 3;
  const std::string odd = (root / "odd").string();
  audit_run(n, odd, cpu, &fx);
  dirs.push_back(odd);
  v = audit_score(dirs, current_build_identity(), 3);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, "replicates") << v.detail;
  fs::remove_all(root);
}
