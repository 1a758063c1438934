// End-to-end `moesq audit`: schedule JSON reproduces paper 000's numbers, the scorer's self-test rejects
// all seven mutations, and run → score accepts identical replicates and rejects a tampered run.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

struct Result {
  int rc;
  std::string out;
};
Result run(const std::string& args) {
  const std::string cmd = std::string(MOESQ_BINARY) + " " + args + " 2>&1";
  Result r{-1, ""};
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int st = pclose(p);
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  return r;
}

std::string tmpdir(const std::string& tag) {
  const auto d = fs::temp_directory_path() / ("moesq_cli_audit_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

}  // namespace

TEST(CliAudit, ScheduleJsonReproducesPaperNumbers) {
  const auto r246 = run("audit schedule --blocks 50 --n 1536 --k 2048 --thread-k 64 --thread-n 128 --grid 246 --json");
  ASSERT_EQ(r246.rc, 0) << r246.out;
  const auto j = nlohmann::json::parse(r246.out);
  EXPECT_EQ(j["tiles"], 600);
  EXPECT_EQ(j["direct_tiles"], 492);
  EXPECT_EQ(j["split_tiles"], 108);
  EXPECT_EQ(j["first_split_block"], 41);
  EXPECT_EQ(j["slices"], 2);
  const auto r200 = run("audit schedule --blocks 50 --n 1536 --k 2048 --thread-k 64 --thread-n 128 --grid 200 --json");
  ASSERT_EQ(r200.rc, 0) << r200.out;
  const auto k = nlohmann::json::parse(r200.out);
  EXPECT_EQ(k["direct_tiles"], 400);
  EXPECT_EQ(k["first_split_block"], 33);
  EXPECT_EQ(k["slices"], 1);
  const auto inv = run("audit schedule --grid 246 --schedule invariant --json");
  ASSERT_EQ(inv.rc, 0) << inv.out;
  EXPECT_EQ(nlohmann::json::parse(inv.out)["split_tiles"], 0);
  EXPECT_NE(run("audit schedule --thread-k 96 --json").rc, 0);  // does not divide K = 2048
}

TEST(CliAudit, SelfTestRejectsAllSevenMutations) {
  const auto r = run("audit score --self-test --fixture small");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("self-test PASSED"), std::string::npos) << r.out;
  int rejected = 0;
  for (size_t p = 0; (p = r.out.find("): rejected for '", p)) != std::string::npos; ++p) ++rejected;
  EXPECT_EQ(rejected, 7) << r.out;
}

TEST(CliAudit, RunThenScore) {
  const std::string d = tmpdir("run");
  for (int i = 0; i < 2; ++i) {
    const auto r = run("audit run --fixture small --history H1 --grid 40 --out " + d + "/r" + std::to_string(i) +
                       " --replicate " + std::to_string(i));
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  for (const char* f : {"manifest.json", "plan.json", "surfaces.safetensors"}) EXPECT_TRUE(fs::exists(d + "/r0/" + f)) << f;
  const auto ok = run("audit score --replicates 2 " + d);
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_EQ(run("audit score --replicates 3 " + d).rc, 1);  // only 2 outcomes
  // Tamper with the grid marker of one run: rejected for 'grid'.
  auto m = nlohmann::json::parse(std::ifstream(d + "/r1/manifest.json"));
  m["config"]["grid"] = 41;
  std::ofstream(d + "/r1/manifest.json") << m.dump(2);
  const auto bad = run("audit score --replicates 2 " + d);
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.out.find("REJECTED (grid)"), std::string::npos) << bad.out;
  EXPECT_NE(run("audit run --fixture small --out " + d + "/x --intervention exchange").rc, 0);  // no --routes
  fs::remove_all(d);
}
