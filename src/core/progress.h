// Progress lines on stderr for long stages ("[compress] layer 2/4 expert 17/32 ...").
// Silenced by MOESQ_QUIET=1 so that tests and scripts keep clean logs; stdout stays for results.
#pragma once
#include <cstdint>
#include <string>

namespace moesq {

void progress(const std::string& stage, const std::string& message);
bool progress_enabled();
// "layer 3/4" for layer index 2 of 4: how every line a human reads names a layer (progress, warnings,
// the loss table, per-layer errors) — 1-based of L. Tensor names keep their 0-based index
// (model.layers.2.*), and so do report.json's "layer" fields and loss_per_layer.csv.
std::string layer_label(int64_t layer, int64_t num_layers);
void set_progress_enabled(bool on);
// A duration for a human: "8.4 s" under a minute, "4 min 05 s" under an hour, else "2 h 03 min".
// Negative or non-finite: "?".
std::string duration_text(double seconds);
// "ETA 4 min 05 s": the time left at the rate so far, `elapsed` seconds for `done` of `total` units;
// "" while nothing is done (no rate yet) or when all is.
std::string eta_text(double elapsed, double done, double total);

}  // namespace moesq
