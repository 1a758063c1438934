// Writes the result of compress_model: the compressed checkpoint itself through
// io::write_compressed_checkpoint (docs/FORMAT.md), plus report.json (method, measured bits/weight,
// per-expert tokens, errors and refinement curves). Everything is built in a temporary sibling
// directory and renamed into place at the end (AtomicDir).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "compress/calib.h"
#include "compress/pipeline.h"
#include "io/checkpoint.h"

namespace moesq::compress {

struct ExportSummary {
  double bits_per_expert_weight = 0;  // measured: 8 · bytes of expert tensors in the written files / #weights
  int64_t expert_bytes = 0;           // bytes of the expert tensors as written
  int64_t expert_weights = 0;         // L · E · 3 · H · I
  nlohmann::json report;              // what went to report.json
};

// `extra` is merged into report.json (command line, calibration source, …).
ExportSummary write_compressed(const io::Checkpoint& src, const CompressResult& r, const CompressOptions& opt,
                               const CalibSet& calib, const std::string& out_dir, const nlohmann::json& extra);

}  // namespace moesq::compress
