#include "io/compressed_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "io/import_checkpoint.h"

namespace fs = std::filesystem;

namespace moesq::io {

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Raw bytes of a U8 / F8_E4M3 tensor with the expected dtype and shape.
std::vector<uint8_t> get_bytes(const Checkpoint& ckpt, const std::string& name, DType dtype,
                               const std::vector<int64_t>& shape) {
  const TensorView& t = ckpt.get(name);
  MOESQ_CHECK(t.dtype == dtype, "tensor ", name, " in ", ckpt.dir(), " has dtype ", dtype_name(t.dtype),
              ", expected ", dtype_name(dtype));
  MOESQ_CHECK(t.shape == shape, "tensor ", name, " in ", ckpt.dir(), " has shape ", t.shape_str(),
              ", expected ", shape_str(shape));
  return std::vector<uint8_t>(t.data, t.data + t.nbytes);
}

float get_global_scale(const Checkpoint& ckpt, const std::string& name) {
  const std::vector<float> g = ckpt.get_f32(name, {1});
  format::check_stored_tensor_scale(g[0], name + " in " + ckpt.dir());
  return g[0];
}

}  // namespace

QuantizationConfig read_quantization_config(const Checkpoint& ckpt) {
  QuantizationConfig q;
  q.act_block = format::kActScaleBlock;
  const auto& cfg = ckpt.config();
  if (!cfg.contains("quantization_config")) return q;
  const auto& qc = cfg["quantization_config"];
  const std::string where = ckpt.dir() + "/config.json quantization_config";
  MOESQ_CHECK(qc.is_object(), where, " is not an object");
  // moesq's own quantization_config, or compressed-tensors (NVFP4 / pack-quantized INT4); any other
  // quant_method (fp8, gptq, awq, ...) quantizes tensors moesq would otherwise read as plain weights.
  if (qc.contains("quant_method")) {
    const auto& m = qc["quant_method"];
    if (m == "compressed-tensors") {
      q = read_compressed_tensors_config(qc, where);
      resolve_ct_expert_groups(ckpt, q, where);
      return q;
    }
    MOESQ_CHECK(m == "moesq", where, ": quant_method ", m.dump(), " is not supported (expected \"moesq\" or "
                "\"compressed-tensors\"; moesq also reads bf16/f16/f32 checkpoints)");
  }
  MOESQ_CHECK(qc.contains("format") && qc["format"].is_string(), where, ": missing string key \"format\"");
  q.format_name = qc["format"].get<std::string>();
  if (q.format_name == "paired-4:8-nvfp4") {
    q.storage = ExpertStorage::Sparse48;
    q.act_block = format::kSparseScaleBlock;
  } else if (q.format_name == "nvfp4") {
    q.storage = ExpertStorage::Nvfp4;
    q.act_block = format::kDenseScaleBlock;
  } else {
    MOESQ_FAIL(where, ".format = \"", q.format_name, "\" is not supported (expected \"paired-4:8-nvfp4\" or \"nvfp4\")");
  }
  if (qc.contains("input_activations") && qc["input_activations"].is_object() &&
      qc["input_activations"].contains("block_size")) {
    const auto& b = qc["input_activations"]["block_size"];
    MOESQ_CHECK(b.is_number_integer() && (b.get<int>() == 16 || b.get<int>() == 32), where,
                ": input_activations.block_size must be 16 or 32");
    q.act_block = b.get<int>();
  }
  return q;
}

nlohmann::json quantization_config_json(bool sparse48, const std::string& method) {
  const int block = sparse48 ? format::kSparseScaleBlock : format::kDenseScaleBlock;
  return {
      {"quant_method", "moesq"},
      {"format", sparse48 ? "paired-4:8-nvfp4" : "nvfp4"},
      {"method", method},
      {"weight_block_size", block},
      {"input_activations", {{"type", "nvfp4"}, {"block_size", block}, {"dynamic", true}}},
      {"targets", {"routed_experts"}},
  };
}

void add_packed_weight(SafetensorsWriter& w, const std::string& prefix, const format::PackedWeight& p) {
  const int64_t N = p.N(), K = p.K();
  const float gs = p.global_scale();
  if (const format::Sparse48Tensor* s = p.sparse48()) {
    w.add(prefix + kWeightPacked, DType::U8, {N, K / 4}, s->values.data(), s->values.size());
    w.add(prefix + kWeightMeta, DType::U8, {N, K / 16}, s->meta.data(), s->meta.size());
    w.add(prefix + kWeightScale, DType::F8_E4M3, {N, K / 32}, s->scales.data(), s->scales.size());
  } else {
    const format::Nvfp4Tensor* d = p.nvfp4();
    w.add(prefix + kWeightPacked, DType::U8, {N, K / 2}, d->values.data(), d->values.size());
    w.add(prefix + kWeightScale, DType::F8_E4M3, {N, K / 16}, d->scales.data(), d->scales.size());
  }
  w.add(prefix + kWeightGlobalScale, DType::F32, {1}, &gs, sizeof(float));
}

format::PackedWeight read_packed_weight(const Checkpoint& ckpt, const QuantizationConfig& q,
                                        const std::string& prefix, int64_t N, int64_t K) {
  MOESQ_CHECK(q.storage != ExpertStorage::Dense, "tensor ", prefix, kWeightPacked, " in ", ckpt.dir(),
              " but config.json has no quantization_config");
  if (q.layout != CheckpointLayout::Moesq) return read_compressed_tensors_weight(ckpt, q, prefix, N, K);
  if (q.storage == ExpertStorage::Sparse48) {
    MOESQ_CHECK(K % format::kSparseScaleBlock == 0, "tensor ", prefix, ": K = ", K, " is not a multiple of ",
                format::kSparseScaleBlock);
    format::Sparse48Tensor t;
    t.N = N;
    t.K = K;
    t.values = get_bytes(ckpt, prefix + kWeightPacked, DType::U8, {N, K / 4});
    t.meta = get_bytes(ckpt, prefix + kWeightMeta, DType::U8, {N, K / 16});
    t.scales = get_bytes(ckpt, prefix + kWeightScale, DType::F8_E4M3, {N, K / 32});
    t.global_scale = get_global_scale(ckpt, prefix + kWeightGlobalScale);
    return t;
  }
  MOESQ_CHECK(K % format::kDenseScaleBlock == 0, "tensor ", prefix, ": K = ", K, " is not a multiple of ",
              format::kDenseScaleBlock);
  format::Nvfp4Tensor t;
  t.N = N;
  t.K = K;
  t.values = get_bytes(ckpt, prefix + kWeightPacked, DType::U8, {N, K / 2});
  t.scales = get_bytes(ckpt, prefix + kWeightScale, DType::F8_E4M3, {N, K / 16});
  t.global_scale = get_global_scale(ckpt, prefix + kWeightGlobalScale);
  return t;
}

void write_compressed_checkpoint(const Checkpoint& src, const PackedExpertSource& packed, bool sparse48,
                                 const std::string& method, const std::string& dir, size_t max_shard_bytes) {
  const ModelSpec& spec = src.spec();
  SafetensorsWriter w;
  // Names as the source stores them (a nested hub layout keeps its prefix, io/hub_layout.h); routed
  // experts always per expert, also when the source fused them.
  for (const std::string& name : src.names()) {
    if (is_compressed_expert_tensor(spec, name)) continue;  // replaced below
    const TensorView& t = src.get(name);
    w.add(src.stored_name(name), t.dtype, t.shape, t.data, t.nbytes);
  }
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    if (!spec.is_moe_layer(l)) continue;  // a dense MLP layer was copied above, as stored
    for (int64_t e = 0; e < spec.num_experts; ++e)
      for (int p = 0; p < 3; ++p) {
        const auto proj = static_cast<ExpertProj>(p);
        add_packed_weight(w, src.stored_name(expert_tensor_prefix(spec, l, e, proj)), packed(l, e, proj));
      }
  }
  write_checkpoint_tensors(dir, w, max_shard_bytes);

  nlohmann::json cfg = src.config();
  cfg["quantization_config"] = quantization_config_json(sparse48, method);
  write_file_atomic((fs::path(dir) / "config.json").string(),
                    src.stored_config(cfg).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  // Other files of the source checkpoint (tokenizer, generation config) travel unchanged.
  copy_side_files(src, dir);
}

std::vector<std::string> copied_expert_tensors(const Checkpoint& src) {
  std::vector<std::string> out;
  for (const std::string& name : src.names())
    if (is_expert_tensor(name) && !is_compressed_expert_tensor(src.spec(), name)) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

void copy_side_files(const Checkpoint& src, const std::string& dir) {
  for (const auto& entry : fs::directory_iterator(src.dir())) {
    const std::string fn = entry.path().filename().string();
    if (!entry.is_regular_file() || fn == "config.json" || fn == "model.safetensors.index.json" ||
        entry.path().extension() == ".safetensors")
      continue;
    std::error_code ec;
    fs::copy_file(entry.path(), fs::path(dir) / fn, fs::copy_options::overwrite_existing, ec);
    MOESQ_CHECK(!ec, "cannot copy ", entry.path().string(), " to ", dir, ": ", ec.message());
  }
}

ExpertStorageCensus census_expert_storage(const Checkpoint& ckpt, const QuantizationConfig& q) {
  const ModelSpec& s = ckpt.spec();
  // Walks the tensors the checkpoint holds, not the spec's layers × experts × 3: the work is bounded by
  // the files, so a config.json claiming 10^9 experts costs nothing (it hung inspect / eval before).
  // Projections are then taken in (layer, expert, proj) order, so first_mismatch is the same as a
  // walk over the spec would find. Names follow the family's table (io::expert_tensor_prefix).
  std::map<std::tuple<int64_t, int64_t, int>, std::pair<bool, bool>> seen;  // → (packed, dense)
  const LayerTensorNames& names = layer_tensor_names(s.model_type);
  for (const std::string& name : ckpt.names()) {
    int64_t fl = 0;
    if (is_fused_expert_weight(name, &fl) && fl < s.num_layers && s.is_moe_layer(fl)) {  // dense, every expert
      const bool gate_up = names.fused_gate_up && name == layer_tensor(fl, names.fused_gate_up);
      const std::vector<int64_t>& shape = ckpt.get(name).shape;  // bounded by the tensor, not the config
      const int64_t n_e = std::min<int64_t>(s.num_experts, shape.empty() ? 0 : shape[0]);
      for (int64_t e = 0; e < n_e; ++e)
        for (int p = gate_up ? 0 : 2; p < (gate_up ? 2 : 3); ++p) seen[{fl, e, p}].second = true;
      continue;
    }
    const auto t = parse_expert_tensor(name);
    if (!t || t->layer >= s.num_layers || t->expert >= s.num_experts || !s.is_moe_layer(t->layer)) continue;
    const std::optional<ExpertProj> proj = expert_proj_of(t->proj);
    if (!proj) continue;
    const std::string prefix = expert_tensor_prefix(s, t->layer, t->expert, *proj);
    const bool packed = name == prefix + kWeightPacked || name == prefix + kWeightSparsePacked,
               dense = name == prefix + kWeight;
    if (!packed && !dense) continue;
    auto& [has_packed, has_dense] = seen[{t->layer, t->expert, static_cast<int>(*proj)}];
    has_packed |= packed;
    has_dense |= dense;
  }
  ExpertStorageCensus c;
  for (const auto& [key, state] : seen) {
    const auto& [l, e, p] = key;
    const auto [packed, dense] = state;
    c.packed += packed;
    c.dense += dense;
    // Dense config: any packed tensor disagrees; packed config: a dense .weight does, unless the
    // compressed-tensors config leaves its module unquantized (ignored or targeted by no group).
    bool bad = q.storage == ExpertStorage::Dense ? packed : dense;
    if (bad && dense && q.layout != CheckpointLayout::Moesq)
      bad = ct_group_of(q, ckpt.stored_name(expert_tensor_prefix(s, l, e, static_cast<ExpertProj>(p)))) != nullptr;
    if (!bad) continue;
    if (c.first_mismatch.empty())
      c.first_mismatch =
          expert_tensor_prefix(s, l, e, static_cast<ExpertProj>(p)) + (packed ? kWeightPacked : kWeight);
    ++c.mismatches;
  }
  return c;
}

void check_expert_storage(const Checkpoint& ckpt, const QuantizationConfig& q, bool allow_mixed) {
  // An integer routed-expert `.weight` (int8 / uint8 / int32 codes, often beside a weight_scale) is a
  // quantized tensor whose scheme config.json does not declare; read as floats it would be raw codes.
  for (const std::string& name : ckpt.names()) {
    const auto t = parse_expert_tensor(name);
    if (!t || !expert_proj_of(t->proj) || name.size() < 7 || name.compare(name.size() - 7, 7, kWeight) != 0) continue;
    const DType dt = ckpt.get(name).dtype;
    MOESQ_CHECK(dt != DType::I8 && dt != DType::U8 && dt != DType::I32 && dt != DType::I64, ckpt.dir(), ": tensor ", name,
                " has integer dtype ", dtype_name(dt), " but config.json declares no quantization scheme for it (",
                q.storage == ExpertStorage::Dense ? "no quantization_config" : "format \"" + q.format_name + "\"",
                "); moesq reads expert .weight tensors as bf16/f16/f32 only");
  }
  const ExpertStorageCensus c = census_expert_storage(ckpt, q);
  if (c.mismatches == 0 || allow_mixed) return;
  MOESQ_FAIL(ckpt.dir(), ": tensor ", c.first_mismatch, " does not match config.json's quantization_config (",
             q.storage == ExpertStorage::Dense ? "none: dense experts" : "format \"" + q.format_name + "\"", "): ",
             c.packed, " expert projections are packed, ", c.dense, " dense, ", c.mismatches,
             " disagree with the config (a half-compressed checkpoint); pass --allow-mixed to load it anyway");
}

nlohmann::json not_compressed_summary(const Checkpoint& src) {
  const ModelSpec& s = src.spec();
  nlohmann::json j = nlohmann::json::object();
  for (TensorRole r : {TensorRole::Router, TensorRole::RouterBias, TensorRole::SharedExpert,
                       TensorRole::SharedExpertGate, TensorRole::DenseMlp, TensorRole::ExpertBias,
                       TensorRole::Other})
    j[tensor_role_name(r)] = 0;
  int64_t copied = 0;
  for (const std::string& name : src.names()) {
    const TensorRole r = tensor_role(s, name);
    if (r != TensorRole::RoutedExpert) j[tensor_role_name(r)] = j[tensor_role_name(r)].get<int64_t>() + 1;
    else copied += !is_compressed_expert_tensor(s, name);
  }
  j["copied_expert"] = copied;  // routed-expert tensors of layers the model does not run (copied_expert_tensors)
  nlohmann::json dense = nlohmann::json::array();
  for (int64_t l = 0; l < s.num_layers; ++l)
    if (!s.is_moe_layer(l)) dense.push_back(l);
  j["dense_mlp_layers"] = dense;
  return j;
}

int64_t expert_tensor_bytes(const Checkpoint& ckpt) {
  int64_t bytes = 0;
  for (const std::string& name : ckpt.names())
    if (is_compressed_expert_tensor(ckpt.spec(), name)) bytes += static_cast<int64_t>(ckpt.get(name).nbytes);
  return bytes;
}

}  // namespace moesq::io
