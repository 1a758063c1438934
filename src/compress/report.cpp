#include "compress/report.h"

#include "compress/refine/options.h"

#include <cmath>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/compressed_checkpoint.h"

namespace fs = std::filesystem;

namespace moesq::compress {

namespace {

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

ExportSummary write_compressed(const io::Checkpoint& src, const CompressResult& r, const CompressOptions& opt,
                               const CalibSet& calib, const std::string& out_dir, const nlohmann::json& extra) {
  AtomicDir dir(out_dir, "--out", "report.json", {src.dir()});
  const io::ModelSpec& spec = src.spec();
  const bool sparse = method_is_sparse(opt.method);
  progress("export", "writing " + out_dir);

  io::write_compressed_checkpoint(
      src,
      [&](int64_t l, int64_t e, io::ExpertProj p) -> const format::PackedWeight& {
        return r.experts.at(static_cast<size_t>(l)).at(static_cast<size_t>(e)).proj[static_cast<size_t>(p)];
      },
      sparse, method_name(opt.method), dir.path());

  // Measure bits/weight from the bytes actually written: reopen the files.
  ExportSummary sum;
  sum.expert_bytes = io::expert_tensor_bytes(io::Checkpoint(dir.path()));
  sum.expert_weights = spec.num_layers * spec.num_experts * 3 * spec.hidden_size * spec.moe_intermediate_size;
  sum.bits_per_expert_weight = 8.0 * static_cast<double>(sum.expert_bytes) / static_cast<double>(sum.expert_weights);

  nlohmann::json layers = nlohmann::json::array();
  nlohmann::json fallbacks = nlohmann::json::array();
  double err_sum = 0;
  int64_t err_n = 0;
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    nlohmann::json experts = nlohmann::json::array();
    for (const ExpertReport& rep : r.reports) {
      if (rep.layer != l) continue;
      nlohmann::json j = {{"expert", rep.expert}, {"tokens", rep.tokens}, {"rel_error", finite_or_null(rep.rel_error)},
                          {"fallback", rep.fallback}};
      if (!rep.note.empty()) j["note"] = rep.note;
      if (!rep.extra.is_null()) j["refine"] = rep.extra;
      if (rep.fallback) fallbacks.push_back({{"layer", l}, {"expert", rep.expert}, {"reason", rep.note}});
      if (std::isfinite(rep.rel_error)) {
        err_sum += rep.rel_error;
        ++err_n;
      }
      experts.push_back(std::move(j));
    }
    layers.push_back({{"layer", l}, {"experts", std::move(experts)}});
  }
  sum.report = {
      {"method", method_name(opt.method)},
      {"format", sparse ? "paired-4:8-nvfp4" : "nvfp4"},
      {"bits_per_expert_weight", sum.bits_per_expert_weight},
      {"expert_bytes", sum.expert_bytes},
      {"expert_weights", sum.expert_weights},
      {"seconds", r.seconds},
      {"calibration", {{"source", calib.source}, {"sequences", calib.sequences.size()}, {"tokens", calib.tokens()}}},
      {"sgptq", {{"percdamp", opt.sgptq.percdamp}, {"block_size", opt.sgptq.block_size}}},
      {"mean_rel_error", err_n ? nlohmann::json(err_sum / static_cast<double>(err_n)) : nlohmann::json(nullptr)},
      {"fallbacks", fallbacks},
      {"layers", layers},
  };
  if (opt.method == Method::Moesq)
    sum.report["refine_options"] = refine_options_to_json(opt.refine);
  for (auto it = extra.begin(); it != extra.end(); ++it) sum.report[it.key()] = it.value();
  write_file_atomic((fs::path(dir.path()) / "report.json").string(), sum.report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  dir.commit();
  return sum;
}

}  // namespace moesq::compress
