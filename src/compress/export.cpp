#include "compress/export.h"

#include "compress/refine.h"

#include <cmath>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/tensor_names.h"

namespace fs = std::filesystem;

namespace moesq::compress {

namespace {

void add_packed(io::SafetensorsWriter& w, const std::string& prefix, const format::PackedWeight& p) {
  const int64_t N = p.N(), K = p.K();
  const float gs = p.global_scale();
  if (const format::Sparse48Tensor* s = p.sparse48()) {
    w.add(prefix + io::kWeightPacked, io::DType::U8, {N, K / 4}, s->values.data(), s->values.size());
    w.add(prefix + io::kWeightMeta, io::DType::U8, {N, K / 16}, s->meta.data(), s->meta.size());
    w.add(prefix + io::kWeightScale, io::DType::F8_E4M3, {N, K / 32}, s->scales.data(), s->scales.size());
  } else {
    const format::Nvfp4Tensor* d = p.nvfp4();
    w.add(prefix + io::kWeightPacked, io::DType::U8, {N, K / 2}, d->values.data(), d->values.size());
    w.add(prefix + io::kWeightScale, io::DType::F8_E4M3, {N, K / 16}, d->scales.data(), d->scales.size());
  }
  w.add(prefix + io::kWeightGlobalScale, io::DType::F32, {1}, &gs, sizeof(float));
}

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

}  // namespace

ExportSummary write_compressed(const io::Checkpoint& src, const CompressResult& r, const CompressOptions& opt,
                               const CalibSet& calib, const std::string& out_dir, const nlohmann::json& extra) {
  AtomicDir dir(out_dir, "--out", "report.json", {src.dir()});
  const io::ModelSpec& spec = src.spec();
  const bool sparse = method_is_sparse(opt.method);
  progress("export", "writing " + out_dir);

  io::SafetensorsWriter w;
  for (const std::string& name : src.names()) {
    if (io::is_expert_tensor(name)) continue;
    const io::TensorView& t = src.get(name);
    w.add(name, t.dtype, t.shape, t.data, t.nbytes);
  }
  for (size_t l = 0; l < r.experts.size(); ++l)
    for (size_t e = 0; e < r.experts[l].size(); ++e)
      for (int p = 0; p < 3; ++p)
        add_packed(w, io::expert_tensor_prefix(static_cast<int64_t>(l), static_cast<int64_t>(e), io::kExpertProjNames[p]),
                   r.experts[l][e].proj[p]);
  io::write_checkpoint_tensors(dir.path(), w);

  nlohmann::json cfg = src.config();
  const int block = sparse ? format::kSparseScaleBlock : format::kDenseScaleBlock;
  cfg["quantization_config"] = {
      {"quant_method", "moesq"},
      {"format", sparse ? "paired-4:8-nvfp4" : "nvfp4"},
      {"method", method_name(opt.method)},
      {"weight_block_size", block},
      {"input_activations", {{"type", "nvfp4"}, {"block_size", block}, {"dynamic", true}}},
      {"targets", {"routed_experts"}},
  };
  write_file_atomic((fs::path(dir.path()) / "config.json").string(), cfg.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  // Other files of the source checkpoint (tokenizer, generation config) travel unchanged.
  for (const auto& entry : fs::directory_iterator(src.dir())) {
    const std::string fn = entry.path().filename().string();
    if (!entry.is_regular_file() || fn == "config.json" || fn == "model.safetensors.index.json" ||
        entry.path().extension() == ".safetensors")
      continue;
    fs::copy_file(entry.path(), fs::path(dir.path()) / fn, fs::copy_options::overwrite_existing);
  }

  // Measure bits/weight from the bytes actually written: reopen the files.
  ExportSummary sum;
  {
    io::Checkpoint written(dir.path());
    for (const std::string& name : written.names())
      if (io::is_expert_tensor(name)) sum.expert_bytes += static_cast<int64_t>(written.get(name).nbytes);
  }
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
