// Writes the result of compress_model: the compressed checkpoint itself through
// io::write_compressed_checkpoint (docs/FORMAT.md), plus report.json (method, measured bits/weight,
// per-expert tokens, errors and refinement curves). Everything is built in a temporary sibling
// directory and renamed into place at the end (AtomicDir).
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "compress/calib.h"
#include "compress/pipeline.h"
#include "io/checkpoint.h"

namespace moesq::compress {

// Per-layer reconstruction loss, mean over the layer's experts with a finite value (NaN when none).
// moesq: the held-out Eq. 4 loss of the SGPTQ initialization and of the refined expert
// (init_hard_loss → final_hard_loss, report.json "refine"); every method: rel_error.
struct LayerLoss {
  int64_t layer = 0, experts = 0;  // experts = how many contributed to rel_error
  double init_hard_loss = 0, final_hard_loss = 0, rel_error = 0;
  // moesq: how many refined experts packed each epoch's state ("0" = the initial solution;
  // RefineOptions::restore_best), keyed by the epoch as a string; empty for other methods.
  std::map<std::string, int64_t> selected_epochs;
};
std::vector<LayerLoss> loss_per_layer(const CompressResult& r, int64_t num_layers);
// CSV: layer,experts,init_hard_loss,final_hard_loss,rel_error (empty field for NaN).
std::string loss_per_layer_csv(const std::vector<LayerLoss>& rows);
// Draws `csv` as a PNG bar chart with gnuplot when `gnuplot` is on PATH. Returns "" when the PNG was
// written, else a one-line note saying why not (never an error: the plot is a convenience).
std::string plot_loss_per_layer(const std::string& csv, const std::string& png, bool refined);

struct ExportSummary {
  double bits_per_expert_weight = 0;  // measured: 8 · bytes of expert tensors in the written files / #weights
  int64_t expert_bytes = 0;           // bytes of the expert tensors as written
  int64_t expert_weights = 0;         // L · E · 3 · H · I
  nlohmann::json report;              // what went to report.json
  std::vector<LayerLoss> layer_loss;  // also written as OUT/loss_per_layer.csv
  std::string plot_note;              // "" when OUT/loss_per_layer.png was drawn, else why not
};

// `extra` is merged into report.json (command line, calibration source, …). Also writes
// OUT/loss_per_layer.csv and, with `plot`, OUT/loss_per_layer.png (plot_loss_per_layer).
ExportSummary write_compressed(const io::Checkpoint& src, const CompressResult& r, const CompressOptions& opt,
                               const CalibSet& calib, const std::string& out_dir, const nlohmann::json& extra,
                               bool plot = true);

}  // namespace moesq::compress
