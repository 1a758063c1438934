// Crash-safe resume of `moesq compress` (docs/PARALLEL.md): the work directory `<OUT>.work` beside
// OUT, owned by rank 0, where every finished layer is committed atomically:
//   manifest.json        what the records depend on: method and options, the calibration tokens'
//                        SHA-256, every source file's SHA-256 (run_manifest)
//   layer_0000.rec ...   one LayerRecord per committed layer (layer_record.h): its compressed
//                        experts and report rows, the manifest's SHA-256 and that of H_{l+1}
//   lock                 flock'ed while a run uses the directory (released by the kernel on kill -9)
// A record is written to a temporary, fsync'ed and renamed (write_file_atomic): after a kill at any
// moment a layer is either fully committed or absent. The directory is removed once OUT is written.
// Interrupted (SIGINT / SIGTERM) with layers committed, it is kept and stderr says that --resume
// continues there.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "compress/calib.h"
#include "compress/layer_record.h"
#include "compress/pipeline.h"
#include "core/interrupt.h"
#include "io/checkpoint.h"

namespace moesq::compress {

// Everything a committed layer depends on, as named fields (so a refused resume can say which one
// differs). Not in it, because the output does not depend on them: --threads, the number of ranks,
// --export-format, the paths of the source and calibration files (their contents are). A new option
// that changes the compressed bits must be added here.
nlohmann::json run_manifest(const io::Checkpoint& src, const CalibSet& calib, const CompressOptions& opt);

// The work directory of the output directory `out`.
std::string work_dir_path(const std::string& out);

class WorkDir {
 public:
  // Opens or creates work_dir_path(out) and locks it (Error when another run holds it). With
  // `resume`, committed layers are kept if the directory's manifest equals `manifest`, else an Error
  // names every field that differs with the committed and the current value. Without `resume`, a
  // fresh run replaces OUT and so discards committed layers of an earlier run (a WARNING on stderr
  // says so). No committed layers (or no directory): the run starts from layer 0, and a run that
  // fails before its first commit removes the directory again.
  WorkDir(const std::string& out, const nlohmann::json& manifest, bool resume);
  ~WorkDir();
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;

  const std::string& path() const { return dir_; }
  const std::string& run_sha256() const { return run_sha256_; }  // SHA-256 of the manifest
  // Layers 0 … committed_layers() − 1 have a record (counted when opened and kept up to date by commit).
  int64_t committed_layers() const { return committed_; }
  // Record of committed layer `layer`: Error naming the file if it is damaged, belongs to another
  // layer or another manifest.
  LayerRecord load(int64_t layer) const;
  // Commits layer r.layer (must be committed_layers()): writes it with this run's manifest hash.
  void commit(LayerRecord r);
  // Deletes the directory (after OUT has been written).
  void remove();

 private:
  void open_records(const nlohmann::json& manifest, bool resume);
  // What SIGINT / SIGTERM do with the directory (core/interrupt.h): remove it while nothing is
  // committed (nothing to resume, as a failed run), else keep it and say that --resume continues there.
  void update_interrupt_rule();
  std::string record_path(int64_t layer) const;
  std::string dir_, run_sha256_;
  int64_t committed_ = 0;
  int lock_fd_ = -1;
  bool removed_ = false;
  OnInterrupt interrupt_;
};

}  // namespace moesq::compress
