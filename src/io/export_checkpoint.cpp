// `moesq export` (export_checkpoint.h; docs/FORMAT.md §8, §9). Every expert projection is read through
// read_packed_weight (so any importable NVFP4 layout is a valid source) and rewritten by the byte
// moves of export_layouts.h: no value is re-quantized, the dequantized weights stay bit-identical.
#include "io/export_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "io/compressed_checkpoint.h"
#include "io/export_layouts.h"

namespace fs = std::filesystem;

namespace moesq::io {

namespace {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n"; }

json nvfp4_args(bool input, int group) {
  return {{"num_bits", 4},     {"type", "float"},   {"strategy", "tensor_group"},  {"group_size", group},
          {"symmetric", true}, {"dynamic", input ? json("local") : json(false)}, {"actorder", nullptr},
          {"block_structure", nullptr}, {"observer", input ? "static_minmax" : "minmax"}, {"observer_kwargs", json::object()}};
}

// Calibration amax of an expert's inputs from SRC/report.json (layers[l].experts[e].input_amax
// {gate_up, down}), when compress recorded it. Null json otherwise.
// report.json is a side file (another tool's, hand-edited): entries of another shape are skipped
// like a missing one ({"layers": 5} was "internal error: type_error.306", exit 2).
json report_input_amax(const json& report, int64_t l, int64_t e) {
  auto index_of = [](const json& o, const char* key) {
    const auto it = o.find(key);
    return it != o.end() && it->is_number_integer() ? it->get<int64_t>() : int64_t{-1};
  };
  if (!report.is_object() || !report.contains("layers") || !report["layers"].is_array()) return nullptr;
  for (const json& L : report["layers"]) {
    if (!L.is_object() || index_of(L, "layer") != l || !L.contains("experts") || !L["experts"].is_array()) continue;
    for (const json& E : L["experts"])
      if (E.is_object() && index_of(E, "expert") == e && E.contains("input_amax")) return E["input_amax"];
  }
  return nullptr;
}

// γ_a of one projection (a divisor, like γ): Eq. 5 on the calibration amax, 1.0 when there is none.
float input_global_scale(const json& amax, ExpertProj p, bool* calibrated) {
  const char* key = p == ExpertProj::Down ? "down" : "gate_up";
  if (amax.is_object() && amax.contains(key) && amax[key].is_number()) {
    *calibrated = true;
    return format::nvfp4_tensor_scale(amax[key].get<float>());
  }
  return 1.0f;
}

}  // namespace

ExportFormat parse_export_format(const std::string& s, const std::string& flag) {
  if (s == "moesq") return ExportFormat::Moesq;
  if (s == "compressed-tensors") return ExportFormat::CompressedTensors;
  if (s == "moesq-pair-bitmask") return ExportFormat::PairBitmask;
  MOESQ_FAIL(flag, " \"", s, "\" is not a format (expected moesq, compressed-tensors or moesq-pair-bitmask)");
}

const char* export_format_name(ExportFormat f) {
  switch (f) {
    case ExportFormat::Moesq: return "moesq";
    case ExportFormat::CompressedTensors: return "compressed-tensors";
    case ExportFormat::PairBitmask: return "moesq-pair-bitmask";
  }
  return "?";
}

// The modules of every stored tensor that is not a compressed routed-expert projection (a copied extra
// layer's experts are unquantized modules, io::copied_expert_tensors) — except a module that
// CONTAINS compressed projections: a gpt-oss source keeps its fused expert biases in `mlp.experts`
// (`mlp.experts.gate_up_proj_bias`; the export splits them per expert, into the compressed
// `experts.{e}.gate_proj` modules), and an ignored `mlp.experts` would tell a server (vLLM's
// compressed-tensors MoE method) that the whole expert block is unquantized.
std::vector<std::string> unquantized_modules(const Checkpoint& src) {
  std::set<std::string> compressed_ancestors;  // every dotted prefix of a routed-expert tensor's stored name
  for (const std::string& name : src.names()) {
    if (!is_compressed_expert_tensor(src.spec(), name)) continue;
    const std::string stored = src.stored_name(name);
    for (size_t dot = stored.find('.'); dot != std::string::npos; dot = stored.find('.', dot + 1))
      compressed_ancestors.insert(stored.substr(0, dot));
  }
  std::set<std::string> mods = {"lm_head"};
  for (const std::string& name : src.names()) {
    if (is_compressed_expert_tensor(src.spec(), name)) continue;  // a copied extra layer is unquantized
    const std::string stored = src.stored_name(name);  // module names as a server sees them
    const size_t dot = stored.rfind('.');
    std::string mod = dot == std::string::npos ? stored : stored.substr(0, dot);
    if (!compressed_ancestors.count(mod)) mods.insert(std::move(mod));
  }
  return {mods.begin(), mods.end()};
}

// gpt-oss's fused expert biases of MoE layer l (io::LayerTensorNames::fused_*_bias) → one bias per
// expert Linear, as llm-compressor's per-expert gate/up/down modules hold them:
// `experts.{e}.gate_proj.bias` [I] = gate_up_proj_bias[e, 0::2], `up_proj.bias` [I] = [e, 1::2] (the
// interleave of FORMAT.md "Fused-expert sources"), `down_proj.bias` [H] = down_proj_bias[e]. Element
// bytes are copied (dtype kept, no rounding). Error naming the tensor for a shape that is not [E, 2I] /
// [E, H].
void add_per_expert_biases(SafetensorsWriter& w, const Checkpoint& src, const LayerTensorNames& names, int64_t l) {
  const ModelSpec& s = src.spec();
  const int64_t E = s.num_experts, I = s.moe_intermediate_size, H = s.hidden_size;
  const TensorView& gu = src.get(family_layer_tensor(s, l, names.fused_gate_up_bias, "gate_up_proj bias"));
  const TensorView& dn = src.get(family_layer_tensor(s, l, names.fused_down_bias, "down_proj bias"));
  MOESQ_CHECK(gu.shape == std::vector<int64_t>({E, 2 * I}) && dn.shape == std::vector<int64_t>({E, H}), src.dir(),
              ": tensors ", gu.name, " ", gu.shape_str(), " and ", dn.name, " ", dn.shape_str(), " are not [E=", E,
              ", 2I=", 2 * I, "] and [E, H=", H, "]");
  const size_t es = dtype_size(gu.dtype), ed = dtype_size(dn.dtype);
  std::vector<uint8_t> gate(I * es), up(I * es);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t i = 0; i < I; ++i) {
      std::memcpy(&gate[i * es], gu.data + (e * 2 * I + 2 * i) * es, es);
      std::memcpy(&up[i * es], gu.data + (e * 2 * I + 2 * i + 1) * es, es);
    }
    auto name = [&](ExpertProj p) { return src.stored_name(expert_tensor_prefix(s, l, e, p)) + ".bias"; };
    w.add(name(ExpertProj::Gate), gu.dtype, {I}, gate.data(), gate.size());
    w.add(name(ExpertProj::Up), gu.dtype, {I}, up.data(), up.size());
    w.add(name(ExpertProj::Down), dn.dtype, {H}, dn.data + e * H * ed, H * ed);
  }
}

json compressed_tensors_config_json(const Checkpoint& src, bool pair_bitmask, int scale_block) {
  MOESQ_CHECK(scale_block == 16 || scale_block == 32, "--scale-block ", scale_block, " is not 16 or 32");
  json qc = {
      {"quant_method", "compressed-tensors"},
      {"format", "nvfp4-pack-quantized"},
      {"quantization_status", "compressed"},
      {"config_groups",
       {{"group_0",
         {{"targets", {"Linear"}},
          {"format", "nvfp4-pack-quantized"},
          {"weights", nvfp4_args(false, scale_block)},
          {"input_activations", nvfp4_args(true, scale_block)},
          {"output_activations", nullptr}}}}},
      {"ignore", unquantized_modules(src)},
      {"kv_cache_scheme", nullptr},
      {"sparsity_config", json::object()},
  };
  if (pair_bitmask) qc["paired48_sparse"] = {{"layout", "pair-bitmask"}, {"version", 1}};
  return qc;
}

json write_exported_checkpoint(const Checkpoint& src, ExportFormat f, const std::string& dir, int scale_block,
                               size_t max_shard_bytes) {
  MOESQ_CHECK(scale_block == 0 || scale_block == 16 || scale_block == 32, "--scale-block ", scale_block,
              " is not 16 or 32");
  const ModelSpec& spec = src.spec();
  const QuantizationConfig q = read_quantization_config(src);
  MOESQ_CHECK(q.storage != ExpertStorage::Dense && q.storage != ExpertStorage::Int4, src.dir(),
              ": experts are not NVFP4-compressed (format \"", q.format_name,
              "\"); export reads moesq or compressed-tensors NVFP4 checkpoints (run moesq compress first)");
  json report = nullptr;
  if (std::ifstream rf(fs::path(src.dir()) / "report.json"); rf) report = json::parse(rf, nullptr, false);
  const int64_t H = spec.hidden_size, I = spec.moe_intermediate_size;
  auto read = [&](int64_t l, int64_t e, ExpertProj p) {
    const bool down = p == ExpertProj::Down;
    return read_packed_weight(src, q, expert_tensor_prefix(spec, l, e, p), down ? H : I, down ? I : H);
  };

  int64_t projections = 0, sparse = 0, calibrated = 0;
  if (f == ExportFormat::Moesq) {
    format::PackedWeight cur;
    int64_t first_moe = 0;  // layer 0 may be dense (first_k_dense_replace, mlp_only_layers)
    while (first_moe + 1 < spec.num_layers && !spec.is_moe_layer(first_moe)) ++first_moe;
    const format::PackedWeight first = read(first_moe, 0, ExpertProj::Gate);
    std::string method = "imported";
    if (src.config()["quantization_config"].contains("method") && src.config()["quantization_config"]["method"].is_string())
      method = src.config()["quantization_config"]["method"].get<std::string>();
    write_compressed_checkpoint(
        src,
        [&](int64_t l, int64_t e, ExpertProj p) -> const format::PackedWeight& {
          cur = read(l, e, p);
          MOESQ_CHECK(cur.is_sparse48() == first.is_sparse48(), "tensor ", expert_tensor_prefix(spec, l, e, p), " in ",
                      src.dir(), " is ", cur.is_sparse48() ? "paired 4:8" : "dense NVFP4", " but the first expert "
                      "is not; the moesq layout holds one format per checkpoint");
          ++projections;
          sparse += cur.is_sparse48();
          return cur;
        },
        first.is_sparse48(), method, dir, max_shard_bytes);
  } else {
    const bool pb = f == ExportFormat::PairBitmask;
    // Default: group 32 (the reference's layout) when the experts are paired 4:8, else 16.
    if (scale_block == 0) {
      int64_t first_moe = 0;
      while (first_moe + 1 < spec.num_layers && !spec.is_moe_layer(first_moe)) ++first_moe;
      scale_block = read(first_moe, 0, ExpertProj::Gate).is_sparse48() ? 32 : 16;
    }
    SafetensorsWriter w;
    // Fused expert biases (gpt-oss) are written per expert Linear instead (add_per_expert_biases).
    const LayerTensorNames& names = layer_tensor_names(spec.model_type);
    std::vector<int64_t> fused_bias_layers;
    std::set<std::string> fused_bias;
    for (int64_t l = 0; l < spec.num_layers && names.fused_gate_up_bias && names.fused_down_bias; ++l) {
      const std::string gu = layer_tensor(l, names.fused_gate_up_bias), dn = layer_tensor(l, names.fused_down_bias);
      if (!spec.is_moe_layer(l) || (!src.has(gu) && !src.has(dn))) continue;  // none: already per expert
      fused_bias_layers.push_back(l);
      fused_bias.insert({gu, dn});
    }
    for (const std::string& name : src.names()) {
      if (is_compressed_expert_tensor(spec, name) || fused_bias.count(name)) continue;  // copied_expert_tensors stay
      const TensorView& t = src.get(name);
      w.add(src.stored_name(name), t.dtype, t.shape, t.data, t.nbytes);
    }
    for (int64_t l : fused_bias_layers) add_per_expert_biases(w, src, names, l);
    for (int64_t l = 0; l < spec.num_layers; ++l) {
      if (!spec.is_moe_layer(l)) continue;
      for (int64_t e = 0; e < spec.num_experts; ++e) {
        const json amax = report_input_amax(report, l, e);
        for (int pi = 0; pi < 3; ++pi) {
          const auto p = static_cast<ExpertProj>(pi);
          const std::string prefix = src.stored_name(expert_tensor_prefix(spec, l, e, p));
          const format::PackedWeight pw = read(l, e, p);
          const format::Nvfp4Tensor d = to_dense_nvfp4(pw);
          const int64_t N = d.N, K = d.K;
          if (pb) {
            MOESQ_CHECK(pw.is_sparse48(), "tensor ", prefix, " in ", src.dir(), " is dense NVFP4, not paired 4:8; "
                        "moesq-pair-bitmask needs a paired 4:8 checkpoint (use --format compressed-tensors)");
            const PairBitmaskTensor b = to_pair_bitmask(d, prefix);
            w.add(prefix + kWeightSparsePacked, DType::U8, {N, K / 4}, b.packed.data(), b.packed.size());
            w.add(prefix + kWeightSparseMask, DType::U8, {N, K / 16}, b.mask.data(), b.mask.size());
          } else {
            w.add(prefix + kWeightPacked, DType::U8, {N, K / 2}, d.values.data(), d.values.size());
          }
          if (scale_block == 32) {
            MOESQ_CHECK(pw.is_sparse48(), "tensor ", prefix, " in ", src.dir(), " is dense NVFP4, not paired 4:8; "
                        "--scale-block 32 needs paired 4:8 experts (use --scale-block 16)");
            const std::vector<uint8_t>& s32 = pw.sparse48()->scales;  // [N, K/32]
            w.add(prefix + kWeightScale, DType::F8_E4M3, {N, K / 32}, s32.data(), s32.size());
          } else {
            w.add(prefix + kWeightScale, DType::F8_E4M3, {N, K / 16}, d.scales.data(), d.scales.size());
          }
          w.add(prefix + kWeightGlobalScale, DType::F32, {1}, &d.global_scale, sizeof(float));
          bool cal = false;
          const float gsa = input_global_scale(amax, p, &cal);
          calibrated += cal;
          w.add(prefix + kInputGlobalScale, DType::F32, {1}, &gsa, sizeof(float));
          ++projections;
          sparse += pw.is_sparse48();
        }
      }
    }
    write_checkpoint_tensors(dir, w, max_shard_bytes);
    json cfg = src.config();
    cfg["quantization_config"] = compressed_tensors_config_json(src, pb, scale_block);
    write_file_atomic((fs::path(dir) / "config.json").string(), dump(src.stored_config(cfg)));
    copy_side_files(src, dir);
  }

  const int64_t bytes = expert_tensor_bytes(Checkpoint(dir));
  int64_t weights = 0;
  for (int64_t l = 0; l < spec.num_layers; ++l)
    if (spec.is_moe_layer(l)) weights += spec.num_experts * 3 * H * I;
  json s = {{"source", src.dir()},
            {"format", export_format_name(f)},
            {"source_format", q.format_name},
            {"scale_block", f == ExportFormat::Moesq ? json(nullptr) : json(scale_block)},
            {"projections", projections},
            {"paired48_projections", sparse},
            {"expert_bytes", bytes},
            {"bits_per_expert_weight", weights ? 8.0 * static_cast<double>(bytes) / static_cast<double>(weights) : 0.0}};
  if (f != ExportFormat::Moesq)
    s["input_global_scale"] = calibrated == projections ? "calibration amax (report.json)"
                              : calibrated == 0         ? "default 1.0 (no calibration amax in report.json)"
                                                        : "calibration amax where report.json has it, else 1.0";
  return s;
}

json export_checkpoint(const std::string& src_dir, ExportFormat f, const std::string& out_dir,
                       const std::string& marker, int scale_block, size_t max_shard_bytes) {
  AtomicDir dir(out_dir, "--out", marker, {src_dir});
  const Checkpoint src(src_dir);
  json s = write_exported_checkpoint(src, f, dir.path(), scale_block, max_shard_bytes);
  s["out"] = out_dir;
  write_file_atomic((fs::path(dir.path()) / "export.json").string(), dump(s));
  dir.commit();
  return s;
}

}  // namespace moesq::io
