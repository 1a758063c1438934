// The resume work directory (compress/work_dir.h): commit/load round trip, a resume with other
// settings is refused naming the field, a second run on the same OUT is refused while the first
// holds the lock, a fresh run discards an earlier run's layers, damaged records are errors.
#include <gtest/gtest.h>

#include <signal.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "compress/work_dir.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "io/checkpoint.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

namespace moesq::compress {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

struct Fixture {
  test::TempDir tmp{"moesq_workdir"};
  io::Checkpoint ckpt{MOESQ_DEFAULT_MODEL};
  CalibSet calib;
  CompressOptions opt;
  std::string out;
  Fixture() {
    calib.sequences = {{1, 2, 3, 4}, {5, 6, 7, 8}};
    opt.method = &methods::kSgptq;
    out = tmp.file("out");
  }
  nlohmann::json manifest() const { return run_manifest(ckpt, calib, opt); }
};

LayerRecord record(int64_t layer) {
  LayerRecord r;
  r.layer = layer;
  r.next_inputs_sha256 = std::string(64, static_cast<char>('0' + layer));
  ExpertResult x;
  x.report.layer = layer;
  x.report.expert = 0;
  x.report.tokens = 17 + layer;
  r.experts.push_back(x);
  return r;
}

TEST(WorkDir, CommitsAndResumes) {
  Fixture f;
  {
    WorkDir w(f.out, f.manifest(), false);
    EXPECT_EQ(w.path(), f.out + ".work");
    EXPECT_EQ(w.committed_layers(), 0);
    w.commit(record(0));
    w.commit(record(1));
    EXPECT_THROW(w.commit(record(3)), Error) << "layers are committed in order";
  }
  WorkDir w(f.out, f.manifest(), true);
  ASSERT_EQ(w.committed_layers(), 2);
  const LayerRecord r = w.load(1);
  EXPECT_EQ(r.layer, 1);
  EXPECT_EQ(r.run_sha256, w.run_sha256());
  EXPECT_EQ(r.next_inputs_sha256, record(1).next_inputs_sha256);
  ASSERT_EQ(r.experts.size(), 1u);
  EXPECT_EQ(r.experts[0].report.tokens, 18);
  w.remove();
  EXPECT_FALSE(fs::exists(f.out + ".work"));
}

// An interrupt that sees layer 0's record must keep it and say --resume: the record's rename and the
// switch of the interrupt rule are one step (CI once caught the cleanup between the two, removing the
// committed layer). The watcher's part runs on a thread that fires as soon as the record appears.
TEST(WorkDir, AnInterruptRacingACommitNeverRemovesTheCommittedLayer) {
  Fixture f;
  for (int round = 0; round < 40; ++round) {
    WorkDir w(f.out, f.manifest(), false);
    const fs::path rec = fs::path(w.path()) / "layer_0000.rec";
    std::atomic<bool> go{false};
    std::string text;
    std::thread watcher([&] {
      while (!go.load()) std::this_thread::yield();
      while (!fs::exists(rec)) std::this_thread::yield();
      text = run_interrupt_cleanup(SIGINT);
    });
    go = true;
    w.commit(record(0));
    watcher.join();
    ASSERT_TRUE(fs::exists(rec)) << "round " << round << ": " << text;
    ASSERT_NE(text.find("compress: kept " + w.path() + " (1 layer committed)"), std::string::npos)
        << "round " << round << ": " << text;
    w.remove();
  }
}

TEST(WorkDir, FreshRunDiscardsAnEarlierRunsLayers) {
  Fixture f;
  { WorkDir(f.out, f.manifest(), false).commit(record(0)); }
  f.opt.method = &methods::kMagnitude;  // a fresh run replaces OUT, whatever its settings
  WorkDir w(f.out, f.manifest(), false);
  EXPECT_EQ(w.committed_layers(), 0);
  EXPECT_FALSE(fs::exists(f.out + ".work/layer_0000.rec"));
  w.commit(record(0));
  EXPECT_EQ(w.load(0).run_sha256, w.run_sha256()) << "the new run's manifest";
}

TEST(WorkDir, ResumeWithOtherSettingsNamesWhatDiffers) {
  Fixture f;
  { WorkDir(f.out, f.manifest(), false).commit(record(0)); }
  f.opt.sgptq.percdamp = 0.05;
  const std::string e1 = error_of([&] { WorkDir w(f.out, f.manifest(), true); });
  EXPECT_NE(e1.find("options.sgptq.percdamp (committed 0.01, now 0.05)"), std::string::npos) << e1;
  f.opt.sgptq.percdamp = 0.01;
  f.opt.method = &methods::kMagnitude;
  const std::string e2 = error_of([&] { WorkDir w(f.out, f.manifest(), true); });
  EXPECT_NE(e2.find("method (committed \"sgptq\", now \"magnitude\")"), std::string::npos) << e2;
  f.opt.method = &methods::kSgptq;
  f.calib.sequences[1][2] = 9;
  const std::string e3 = error_of([&] { WorkDir w(f.out, f.manifest(), true); });
  EXPECT_NE(e3.find("calibration.sha256"), std::string::npos) << e3;
  f.calib.sequences[1][2] = 7;
  EXPECT_EQ(WorkDir(f.out, f.manifest(), true).committed_layers(), 1) << "the committed settings resume";
}

TEST(WorkDir, ChangedSourceFileIsNamed) {
  Fixture f;
  nlohmann::json m = f.manifest();
  ASSERT_TRUE(m["source"].contains("config.json")) << m.dump();
  { WorkDir(f.out, m, false).commit(record(0)); }
  m["source"]["model-00002-of-00002.safetensors"] = std::string(64, 'f');
  const std::string e = error_of([&] { WorkDir w(f.out, m, true); });
  EXPECT_NE(e.find("source.model-00002-of-00002.safetensors"), std::string::npos) << e;
}

TEST(WorkDir, SecondRunOnTheSameOutIsRefusedWhileTheFirstHoldsIt) {
  Fixture f;
  WorkDir first(f.out, f.manifest(), false);
  const std::string e = error_of([&] { WorkDir second(f.out, f.manifest(), true); });
  EXPECT_NE(e.find("in use by another moesq compress"), std::string::npos) << e;
}

TEST(WorkDir, FailedRunWithoutCommitsLeavesNothing) {
  Fixture f;
  { WorkDir w(f.out, f.manifest(), false); }
  EXPECT_FALSE(fs::exists(f.out + ".work"));
}

TEST(WorkDir, DamagedRecordIsAnErrorNamingTheFile) {
  Fixture f;
  { WorkDir(f.out, f.manifest(), false).commit(record(0)); }
  const std::string rec = f.out + ".work/layer_0000.rec";
  {
    std::fstream io(rec, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(20);
    io.put('\x7f');
  }
  WorkDir w(f.out, f.manifest(), true);
  const std::string e = error_of([&] { w.load(0); });
  EXPECT_NE(e.find(rec), std::string::npos) << e;
  EXPECT_NE(e.find("checksum mismatch"), std::string::npos) << e;
}

}  // namespace
}  // namespace moesq::compress
