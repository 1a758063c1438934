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
  int64_t calib_samples = 64;
  int64_t seq_len = 128;
  uint64_t seed = 0;
  int threads = 0;
  double percdamp = 0.01;
  // refinement (method moesq)
  std::string objective = "router", update = "AV";
  int epochs = 10;
  double lr_a = 2.5e-4, lr_v = 5e-5, tau0 = 2.0, tau1 = 0.05, kappa0 = 100, kappa1 = 500;
  int64_t batch = 256, micro_batch = 64;

  compress::CompressOptions options(const std::string& method) const;
  compress::CalibSet calibration(const model::Qwen3Moe& m) const;
};

void add_compress_flags(CLI::App* cmd, CompressFlags& f, bool with_calib_files = true);

}  // namespace moesq::cli
