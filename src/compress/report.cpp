#include "compress/report.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/compressed_checkpoint.h"
#include "io/tensor_names.h"

namespace fs = std::filesystem;

namespace moesq::compress {

namespace {

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

// Mean of the finite values (NaN when none).
struct Mean {
  double sum = 0;
  int64_t n = 0;
  void add(double v) {
    if (std::isfinite(v)) sum += v, ++n;
  }
  double get() const { return n ? sum / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN(); }
};

double json_number_or_nan(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number() ? j[key].get<double>()
                                                                 : std::numeric_limits<double>::quiet_NaN();
}

std::string csv_field(double v) {
  if (!std::isfinite(v)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A path as a gnuplot double-quoted string.
std::string gnuplot_string(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

}  // namespace

std::vector<LayerLoss> loss_per_layer(const CompressResult& r, int64_t num_layers) {
  std::vector<LayerLoss> rows;
  for (int64_t l = 0; l < num_layers; ++l) {
    Mean init, fin, rel;
    std::map<std::string, int64_t> sel;
    for (const ExpertReport& rep : r.reports) {
      if (rep.layer != l) continue;
      rel.add(rep.rel_error);
      init.add(json_number_or_nan(rep.extra, "init_hard_loss"));
      fin.add(json_number_or_nan(rep.extra, "final_hard_loss"));
      const double e = json_number_or_nan(rep.extra, "selected_epoch");
      const bool skipped = rep.extra.is_object() && rep.extra.value("skipped", false);
      if (std::isfinite(e) && !skipped) ++sel[std::to_string(static_cast<int64_t>(e))];
    }
    rows.push_back({l, rel.n, init.get(), fin.get(), rel.get(), std::move(sel)});
  }
  return rows;
}

std::string loss_per_layer_csv(const std::vector<LayerLoss>& rows) {
  std::string out = "layer,experts,init_hard_loss,final_hard_loss,rel_error\n";
  for (const LayerLoss& r : rows)
    out += std::to_string(r.layer) + "," + std::to_string(r.experts) + "," + csv_field(r.init_hard_loss) + "," +
           csv_field(r.final_hard_loss) + "," + csv_field(r.rel_error) + "\n";
  return out;
}

std::string plot_loss_per_layer(const std::string& csv, const std::string& png, bool refined) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    return "gnuplot not on PATH: loss_per_layer.png not drawn (Debian: apt install gnuplot-nox)";
  const std::string script = png + ".gp";
  std::string gp = "set terminal pngcairo size 800,480\nset output " + gnuplot_string(png) +
                   "\nset datafile separator \",\"\nset style data histograms\n"
                   "set style histogram cluster gap 1\nset style fill solid 0.8 border -1\n"
                   "set key top left\nset yrange [0:*]\nset xlabel \"layer\"\n";
  if (refined)
    gp += "set title \"moesq: held-out Eq. 4 loss per layer (mean over experts)\"\nset ylabel \"loss\"\n"
          "plot " + gnuplot_string(csv) + " every ::1 using 3:xtic(1) title \"SGPTQ init\", \"\" every ::1 using 4 "
          "title \"refined\"\n";
  else
    gp += "set title \"relative reconstruction error per layer (mean over experts)\"\nset ylabel \"rel error\"\n"
          "plot " + gnuplot_string(csv) + " every ::1 using 5:xtic(1) title \"rel error\"\n";
  write_file_atomic(script, gp);
  std::string q = "'";
  for (char c : script) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  q += "'";
  const int rc = std::system(("gnuplot " + q + " >/dev/null 2>&1").c_str());
  std::error_code ec;
  fs::remove(script, ec);
  if (rc != 0 || !fs::exists(png)) return "gnuplot failed (exit " + std::to_string(rc) + "): loss_per_layer.png not drawn";
  return "";
}

// Routed-expert tensors the model does not run (io::copied_expert_tensors: a multi-token-prediction
// layer past num_hidden_layers, experts past num_experts) are copied whole; said on stderr whatever
// MOESQ_QUIET says, since a reader of the output would otherwise take them for compressed ones.
namespace {
void note_copied_expert_tensors(const io::ModelSpec& spec, const std::vector<std::string>& copied) {
  if (copied.empty()) return;
  std::set<int64_t> layers;
  for (const std::string& n : copied) {
    int64_t l = 0;
    if (const auto t = io::parse_expert_tensor(n)) layers.insert(t->layer);
    else if (io::is_fused_expert_weight(n, &l)) layers.insert(l);
  }
  std::string where;
  for (int64_t l : layers) where += (where.empty() ? "model.layers." : ", model.layers.") + std::to_string(l) + ".*";
  std::fprintf(stderr,
               "NOTE: compress: %zu routed-expert tensors the model does not run (%s; num_hidden_layers = %lld, "
               "num_experts = %lld: e.g. a multi-token-prediction layer) are copied whole, not compressed; "
               "report.json lists them under \"copied_expert_tensors\"\n",
               copied.size(), where.c_str(), static_cast<long long>(spec.num_layers),
               static_cast<long long>(spec.num_experts));
}
}  // namespace

ExportSummary write_compressed(const io::Checkpoint& src, const CompressResult& r, const CompressOptions& opt,
                               const CalibSet& calib, const std::string& out_dir, const nlohmann::json& extra,
                               bool plot) {
  AtomicDir dir(out_dir, "--out", "report.json", {src.dir()});
  const io::ModelSpec& spec = src.spec();
  const bool sparse = opt.method->sparse;
  progress("export", "writing " + out_dir);

  io::write_compressed_checkpoint(
      src,
      [&](int64_t l, int64_t e, io::ExpertProj p) -> const format::PackedWeight& {
        return r.experts.at(static_cast<size_t>(l)).at(static_cast<size_t>(e)).proj[static_cast<size_t>(p)];
      },
      sparse, opt.method->name, dir.path());
  const std::vector<std::string> copied = io::copied_expert_tensors(src);
  note_copied_expert_tensors(spec, copied);

  // Measure bits/weight from the bytes actually written: reopen the files.
  ExportSummary sum;
  sum.expert_bytes = io::expert_tensor_bytes(io::Checkpoint(dir.path()));
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < spec.num_layers; ++l) moe_layers += spec.is_moe_layer(l);
  sum.expert_weights = moe_layers * spec.num_experts * 3 * spec.hidden_size * spec.moe_intermediate_size;
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
    nlohmann::json row = {{"layer", l}, {"experts", std::move(experts)}};
    if (!spec.is_moe_layer(l)) row["dense_mlp"] = "kept as stored (not compressed)";
    layers.push_back(std::move(row));
  }
  sum.report = {
      {"method", opt.method->name},
      {"device", device_name(opt.device)},
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
      {"not_compressed", io::not_compressed_summary(src)},
      {"copied_expert_tensors", copied},
  };
  if (opt.method->options_json) {
    nlohmann::json& o = sum.report[opt.method->report_key] = opt.method->options_json(opt);
    if (opt.method->omitted) o[opt.method->omitted] = false;
  }
  sum.layer_loss = loss_per_layer(r, spec.num_layers);
  nlohmann::json ll = nlohmann::json::array();
  for (const LayerLoss& x : sum.layer_loss)
    ll.push_back({{"layer", x.layer}, {"experts", x.experts}, {"init_hard_loss", finite_or_null(x.init_hard_loss)},
                  {"final_hard_loss", finite_or_null(x.final_hard_loss)}, {"rel_error", finite_or_null(x.rel_error)},
                  {"selected_epochs", x.selected_epochs}});
  sum.report["loss_per_layer"] = ll;
  const std::string csv = (fs::path(dir.path()) / "loss_per_layer.csv").string();
  write_file_atomic(csv, loss_per_layer_csv(sum.layer_loss));
  sum.plot_note = plot ? plot_loss_per_layer(csv, (fs::path(dir.path()) / "loss_per_layer.png").string(),
                                             opt.method->refines)
                       : "plot not requested";
  for (auto it = extra.begin(); it != extra.end(); ++it) sum.report[it.key()] = it.value();
  write_file_atomic((fs::path(dir.path()) / "report.json").string(), sum.report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  dir.commit();
  return sum;
}

}  // namespace moesq::compress
