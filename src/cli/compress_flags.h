// Flags shared by `compress` and `demo`: calibration source, SGPTQ and refinement options.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "compress/calib.h"
#include "compress/pipeline.h"

namespace moesq::cli {

struct CompressFlags {
  std::vector<std::string> calib;
  std::string calib_split = "all";
  int64_t calib_samples = 2048;  // 2048 × 128 = 262,144 tokens (issue 12; docs/RESULTS.md)
  int64_t seq_len = 128;
  uint64_t seed = 0;
  int threads = 0;
  double percdamp = 0.01;
  bool strict = false;  // calibration shortfalls are errors, not warnings
  // refinement (method moesq)
  std::string objective = "router", update = "AV", schedule_scope = "expert";
  std::string select_epoch = "last";  // which refinement state is packed (RefineOptions::restore_best)
  // Shown defaults = the paper's Table 4; a flag NOT given is set per expert by the schedule rule
  // (compress/refine/schedule.h), which returns these values at Table-4 scale.
  int epochs = 10;
  double lr_a = 2.5e-4, lr_v = 5e-5, tau0 = 2.0, tau1 = 0.05, kappa0 = 100, kappa1 = 500;
  int64_t batch = 64, micro_batch = 64;
  // baselines (methods jsq, obr): the reference implementations' defaults
  double jsq_rho = 2.1, obr_alpha = 0.5;
  // true: epochs / batch / lr_a / lr_v above are used as they are (a command's own preset, e.g.
  // `moesq demo`), like flags the user gave.
  bool schedule_preset = false;
  // Filled by add_compress_flags: tells which of --epochs/--batch/--lr-a/--lr-v were given.
  const CLI::Option *epochs_opt = nullptr, *batch_opt = nullptr, *lr_a_opt = nullptr, *lr_v_opt = nullptr;

  compress::CompressOptions options(const std::string& method) const;
  // --calib files (text through the tokenizer of checkpoint `dir`, io::text_tokenizer_for) or, without
  // --calib, sequences sampled from `m`.
  compress::CalibSet calibration(const model::DecoderModel& m, const std::string& dir) const;
};

void add_compress_flags(CLI::App* cmd, CompressFlags& f, bool with_calib_files = true);

}  // namespace moesq::cli
