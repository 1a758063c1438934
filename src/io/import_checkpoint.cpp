// compressed-tensors checkpoints in (import_checkpoint.h; docs/FORMAT.md §10). The config is checked
// field by field against what moesq implements, so an FP8 or W4A8 checkpoint fails with the field
// that differs instead of deep inside the loader.
#include "io/import_checkpoint.h"

#include <cmath>
#include <cstring>
#include <regex>
#include <unordered_map>

#include "core/error.h"
#include "core/half.h"
#include "format/nvfp4.h"
#include "io/export_layouts.h"
#include "io/tensor_names.h"

namespace moesq::io {

namespace {

using nlohmann::json;

std::string shown(const json& obj, const char* key) {
  return obj.is_object() && obj.contains(key) ? obj[key].dump() : std::string("missing");
}

// obj[key] must equal one of `allowed` (a missing key counts as null).
void expect_field(const json& obj, const std::string& where, const std::string& path, const char* key,
                  std::initializer_list<json> allowed) {
  const json v = obj.is_object() && obj.contains(key) ? obj[key] : json(nullptr);
  for (const json& a : allowed)
    if (v == a) return;
  std::string want;
  for (const json& a : allowed) want += (want.empty() ? "" : " or ") + a.dump();
  MOESQ_FAIL(where, ": ", path, ".", key, " is ", shown(obj, key), "; moesq supports ", want);
}

const TensorView& tensor(const Checkpoint& ckpt, const std::string& name, DType dtype,
                         const std::vector<int64_t>& shape) {
  const TensorView& t = ckpt.get(name);
  MOESQ_CHECK(t.dtype == dtype, "tensor ", name, " in ", ckpt.dir(), " has dtype ", dtype_name(t.dtype),
              ", expected ", dtype_name(dtype));
  TensorView want;
  want.shape = shape;
  MOESQ_CHECK(t.shape == shape, "tensor ", name, " in ", ckpt.dir(), " has shape ", t.shape_str(), ", expected ",
              want.shape_str());
  return t;
}

std::vector<uint8_t> bytes_of(const TensorView& t) { return std::vector<uint8_t>(t.data, t.data + t.nbytes); }

// A global scale: one finite positive number (shape [1] or [], any float dtype).
float scalar_scale(const Checkpoint& ckpt, const std::string& name) {
  const TensorView& t = ckpt.get(name);
  MOESQ_CHECK(t.numel() == 1, "tensor ", name, " in ", ckpt.dir(), " has shape ", t.shape_str(),
              ", expected one element");
  const float g = to_f32(t)[0];
  format::check_stored_tensor_scale(g, name + " in " + ckpt.dir());
  return g;
}

// weight_scale as UE4M3 bytes [N, K/16]: stored so (group_size 16), or [N, K/32] (group_size 32, the
// reference's paired 4:8 layout) with each 32-block scale written for both of its 16-blocks — the
// same scale on the same 32 weights, so the dequantized values are unchanged.
std::vector<uint8_t> scales_per_16(const Checkpoint& ckpt, int scale_group, const std::string& prefix, int64_t N,
                                   int64_t K) {
  if (scale_group != 32) return bytes_of(tensor(ckpt, prefix + kWeightScale, DType::F8_E4M3, {N, K / 16}));
  MOESQ_CHECK(K % 32 == 0, "tensor ", prefix, ": K = ", K, " is not a multiple of weights.group_size 32");
  const TensorView& t = tensor(ckpt, prefix + kWeightScale, DType::F8_E4M3, {N, K / 32});
  std::vector<uint8_t> s(static_cast<size_t>(N * K / 16));
  for (int64_t i = 0; i < N * K / 32; ++i) s[2 * i] = s[2 * i + 1] = t.data[i];
  return s;
}

// A list of strings at obj[key] (missing or null: empty unless `required`).
std::vector<std::string> string_list(const json& obj, const std::string& where, const std::string& path,
                                     const char* key, bool required) {
  const bool present = obj.is_object() && obj.contains(key) && !obj[key].is_null();
  MOESQ_CHECK(present || !required, where, ": ", path, ".", key, " is missing; expected a list of module names, "
              "\"re:\" patterns or class names");
  std::vector<std::string> out;
  if (!present) return out;
  const json& v = obj[key];
  MOESQ_CHECK(v.is_array(), where, ": ", path, ".", key, " is ", v.dump(), "; expected a list of strings");
  for (const json& e : v) {
    MOESQ_CHECK(e.is_string(), where, ": ", path, ".", key, " holds ", e.dump(), "; expected strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

// compressed-tensors matches "re:" entries with Python's re.match: anchored at the start of the module
// name, not at its end. std::regex (ECMAScript) reads the patterns these configs use (".*", "\\.",
// "$", classes, alternation); one it cannot parse is an Error naming the entry.
bool regex_matches(const std::string& pattern, const std::string& module) {
  thread_local std::unordered_map<std::string, std::regex> cache;
  auto it = cache.find(pattern);
  if (it == cache.end()) {
    try {
      it = cache.emplace(pattern, std::regex(pattern, std::regex::ECMAScript)).first;
    } catch (const std::regex_error& e) {
      MOESQ_FAIL("quantization_config: \"re:", pattern, "\" is not a regular expression moesq can read (", e.what(),
                 ")");
    }
  }
  return std::regex_search(module, it->second, std::regex_constants::match_continuous);
}

enum class TargetKind { Name, Regex, Class };
TargetKind target_kind(const std::string& t) {
  if (t.rfind("re:", 0) == 0) return TargetKind::Regex;
  return t == "Linear" ? TargetKind::Class : TargetKind::Name;
}
// Does target `t` (of kind k) cover `module`, a Linear module (every routed-expert projection is one)?
bool target_covers(const std::string& t, TargetKind k, const std::string& module) {
  switch (k) {
    case TargetKind::Name: return t == module;
    case TargetKind::Regex: return regex_matches(t.substr(3), module);
    case TargetKind::Class: return true;  // "Linear"
  }
  return false;
}

std::string activations_text(const CtConfigGroup& g) {
  if (!g.act_quant) return "null (weight-only)";
  return "NVFP4 group " + std::to_string(g.act_group) + (g.act_static ? ", static input_global_scale" : ", dynamic");
}

}  // namespace

const CtConfigGroup* ct_group_of(const QuantizationConfig& q, const std::string& module, std::string* ignored_by) {
  for (const std::string& t : q.ignore)
    if (target_covers(t, target_kind(t), module)) {
      if (ignored_by) *ignored_by = t;
      return nullptr;
    }
  // compressed-tensors' priority: an exact module name, then a "re:" pattern, then a class name; among
  // targets of one kind the first group in config order.
  for (TargetKind k : {TargetKind::Name, TargetKind::Regex, TargetKind::Class})
    for (const CtConfigGroup& g : q.groups)
      for (const std::string& t : g.targets)
        if (target_kind(t) == k && target_covers(t, k, module)) return &g;
  return nullptr;
}

void resolve_ct_expert_groups(const Checkpoint& ckpt, QuantizationConfig& q, const std::string& where) {
  if (q.layout == CheckpointLayout::Moesq) return;
  const ModelSpec& s = ckpt.spec();
  // An unquantized module (ignored, or targeted by no group, stored as a dense .weight) runs without
  // activation quantization: it takes part in the comparison as this pseudo group.
  CtConfigGroup unquantized;
  unquantized.name = "(none)";
  const CtConfigGroup* first = nullptr;
  const CtConfigGroup* first_packed = nullptr;
  std::string first_module;
  // Walks the stored tensors (bounded by the files, like census_expert_storage).
  for (const std::string& name : ckpt.names()) {
    const auto t = parse_expert_tensor(name);
    if (!t || t->layer >= s.num_layers || t->expert >= s.num_experts || !s.is_moe_layer(t->layer)) continue;
    const std::optional<ExpertProj> proj = expert_proj_of(t->proj);
    if (!proj) continue;
    const std::string prefix = expert_tensor_prefix(s, t->layer, t->expert, *proj);
    const bool packed = name == prefix + kWeightPacked || name == prefix + kWeightSparsePacked;
    if (!packed && name != prefix + kWeight) continue;
    const std::string module = ckpt.stored_name(prefix);
    std::string ignored_by;
    const CtConfigGroup* g = ct_group_of(q, module, &ignored_by);
    if (packed) {
      MOESQ_CHECK(g, where, ": module ", module, " stores packed weights (", ckpt.stored_name(name), ") but ",
                  ignored_by.empty() ? std::string("no config_groups entry targets it")
                                     : "ignore entry \"" + ignored_by + "\" excludes it",
                  "; its scheme is unknown");
      if (!first_packed) first_packed = g;
    } else {
      if (g) continue;  // a dense .weight the config says is quantized: census_expert_storage reports it
      g = &unquantized;
    }
    if (!first) {
      first = g;
      first_module = module;
      continue;
    }
    auto text = [](const CtConfigGroup& x) {
      return x.name == "(none)" ? std::string("unquantized (ignored or untargeted), activations not quantized")
                                : "config_groups." + x.name + ".input_activations: " + activations_text(x);
    };
    MOESQ_CHECK(g->act_quant == first->act_quant && g->act_group == first->act_group &&
                    g->act_static == first->act_static,
                where, ": routed-expert modules ",
                first_module, " (", text(*first), ") and ", module, " (", text(*g),
                ") run different activation schemes; moesq runs one activation scheme for all routed experts");
  }
  if (!first_packed) return;
  q.act_quant = first_packed->act_quant;
  q.act_group = first_packed->act_group;
  q.act_static = first_packed->act_static;
  q.scale_group = first_packed->scale_group;
  q.weight_group = first_packed->weight_group;
  if (q.layout == CheckpointLayout::CtNvfp4)
    q.act_block = q.act_group == format::kSparseScaleBlock ? format::kSparseScaleBlock : format::kDenseScaleBlock;
}

const CtConfigGroup& ct_group_of_projection(const Checkpoint& ckpt, const QuantizationConfig& q,
                                            const std::string& prefix) {
  std::string ignored_by;
  const std::string module = ckpt.stored_name(prefix);
  const CtConfigGroup* g = ct_group_of(q, module, &ignored_by);
  MOESQ_CHECK(g, ckpt.dir(), "/config.json quantization_config: module ", module, " stores packed weights but ",
              ignored_by.empty() ? std::string("no config_groups entry targets it")
                                 : "ignore entry \"" + ignored_by + "\" excludes it",
              "; its scheme is unknown");
  return *g;
}

QuantizationConfig read_compressed_tensors_config(const json& qc, const std::string& where) {
  MOESQ_CHECK(qc.contains("config_groups") && qc["config_groups"].is_object() && !qc["config_groups"].empty(),
              where, ": config_groups is ", shown(qc, "config_groups"), "; expected at least one group");
  const std::string top = qc.contains("format") && qc["format"].is_string() ? qc["format"].get<std::string>() : "";
  if (qc.contains("kv_cache_scheme")) expect_field(qc, where, "quantization_config", "kv_cache_scheme", {nullptr});
  if (qc.contains("sparsity_config") && qc["sparsity_config"].is_object() && !qc["sparsity_config"].empty())
    expect_field(qc["sparsity_config"], where, "sparsity_config", "format", {"dense", nullptr});

  QuantizationConfig q;
  std::string fmt;
  for (const auto& [gname, g] : qc["config_groups"].items()) {
    const std::string path = "config_groups." + gname;
    CtConfigGroup group;
    group.name = gname;
    group.targets = string_list(g, where, path, "targets", true);
    const std::string f = g.contains("format") && g["format"].is_string() ? g["format"].get<std::string>() : top;
    MOESQ_CHECK(fmt.empty() || f == fmt, where, ": ", path, ".format is \"", f, "\" but another group uses \"", fmt,
                "\"; moesq reads one format per checkpoint");
    fmt = f;
    MOESQ_CHECK(g.contains("weights") && g["weights"].is_object(), where, ": ", path, ".weights is ",
                shown(g, "weights"), "; expected an object");
    const json& w = g["weights"];
    const json none = nullptr;
    const json& in = g.contains("input_activations") ? g["input_activations"] : none;
    if (g.contains("output_activations")) expect_field(g, where, path, "output_activations", {nullptr});
    if (fmt == "nvfp4-pack-quantized") {
      expect_field(w, where, path + ".weights", "type", {"float"});
      expect_field(w, where, path + ".weights", "num_bits", {4});
      expect_field(w, where, path + ".weights", "strategy", {"tensor_group"});
      expect_field(w, where, path + ".weights", "group_size", {16, 32});
      if (w.contains("symmetric")) expect_field(w, where, path + ".weights", "symmetric", {true});
      group.scale_group = w["group_size"].get<int>();
      group.act_quant = !in.is_null();
      if (group.act_quant) {
        expect_field(in, where, path + ".input_activations", "type", {"float"});
        expect_field(in, where, path + ".input_activations", "num_bits", {4});
        expect_field(in, where, path + ".input_activations", "strategy", {"tensor_group"});
        expect_field(in, where, path + ".input_activations", "group_size", {16, 32});
        // "local" / true: γ_a per token (moesq's dynamic quantization, §5); false: the stored
        // input_global_scale of each projection is γ_a.
        expect_field(in, where, path + ".input_activations", "dynamic", {"local", true, false});
        group.act_group = in["group_size"].get<int>();
        group.act_static = in["dynamic"] == false;
      }
    } else if (fmt == "pack-quantized") {
      expect_field(w, where, path + ".weights", "type", {"int"});
      expect_field(w, where, path + ".weights", "num_bits", {4});
      expect_field(w, where, path + ".weights", "symmetric", {true});
      expect_field(w, where, path + ".weights", "strategy", {"group"});
      if (w.contains("actorder")) expect_field(w, where, path + ".weights", "actorder", {nullptr, "static", "weight"});
      MOESQ_CHECK(w.contains("group_size") && w["group_size"].is_number_integer() && w["group_size"].get<int>() > 0,
                  where, ": ", path, ".weights.group_size is ", shown(w, "group_size"), "; expected a positive integer");
      group.weight_group = w["group_size"].get<int>();
      MOESQ_CHECK(in.is_null(), where, ": ", path, ".input_activations is ", in.dump(),
                  "; moesq reads pack-quantized INT4 as weight-only (null)");
    } else {
      MOESQ_FAIL(where, ": format \"", fmt, "\" is not supported (moesq reads compressed-tensors "
                 "\"nvfp4-pack-quantized\" and \"pack-quantized\")");
    }
    q.groups.push_back(std::move(group));
  }
  q.ignore = string_list(qc, where, "quantization_config", "ignore", false);
  // Until the routed experts' own group is resolved (resolve_ct_expert_groups): the first group's.
  const CtConfigGroup& g0 = q.groups.front();
  q.act_quant = g0.act_quant;
  q.act_group = g0.act_group;
  q.act_static = g0.act_static;
  q.scale_group = g0.scale_group;
  q.weight_group = g0.weight_group;
  // The top-level format names the checkpoint's one format ("mixed-precision" when groups differ); a
  // group format that contradicts it means the file is not what either says.
  MOESQ_CHECK(top.empty() || top == fmt || top == "mixed-precision", where, ": format \"", top,
              "\" contradicts config_groups' format \"", fmt, "\" (moesq reads \"nvfp4-pack-quantized\" and "
              "\"pack-quantized\")");
  q.format_name = fmt;
  if (fmt == "pack-quantized") {
    q.storage = ExpertStorage::Int4;
    q.layout = CheckpointLayout::CtInt4;
  } else {
    q.storage = ExpertStorage::Nvfp4;  // per tensor: Sparse48 when the data is paired 4:8
    q.layout = CheckpointLayout::CtNvfp4;
    q.act_block = q.act_group == format::kSparseScaleBlock ? format::kSparseScaleBlock : format::kDenseScaleBlock;
  }
  if (qc.contains("paired48_sparse")) {
    const json& p = qc["paired48_sparse"];
    MOESQ_CHECK(fmt == "nvfp4-pack-quantized", where, ": paired48_sparse needs format \"nvfp4-pack-quantized\", not \"",
                fmt, "\"");
    expect_field(p, where, "paired48_sparse", "layout", {"pair-bitmask"});
    expect_field(p, where, "paired48_sparse", "version", {1});
    q.storage = ExpertStorage::Sparse48;
    q.layout = CheckpointLayout::CtPairBitmask;
    q.act_block = format::kSparseScaleBlock;
  }
  return q;
}

float read_input_global_scale(const Checkpoint& ckpt, const std::string& prefix) {
  return scalar_scale(ckpt, prefix + kInputGlobalScale);
}

StaticActScales read_static_act_scales(const Checkpoint& ckpt, const QuantizationConfig& q, int64_t l, int64_t e) {
  if (!q.act_static || !q.act_quant) return {};
  const ModelSpec& s = ckpt.spec();
  std::string prefix[3];
  for (int p = 0; p < 3; ++p) {
    prefix[p] = expert_tensor_prefix(s, l, e, static_cast<ExpertProj>(p));
    if (!has_packed_projection(ckpt, prefix[p])) return {};  // a fused dense source: nothing static
  }
  const float g = read_input_global_scale(ckpt, prefix[0]), u = read_input_global_scale(ckpt, prefix[1]);
  MOESQ_CHECK(g == u, ckpt.dir(), ": tensors ", prefix[0], kInputGlobalScale, " (", g, ") and ", prefix[1],
              kInputGlobalScale, " (", u, ") differ; gate_proj and up_proj read the same input, quantized once "
              "with one static global scale (input_activations.dynamic false)");
  return {g, read_input_global_scale(ckpt, prefix[2])};
}

format::PackedWeight read_compressed_tensors_weight(const Checkpoint& ckpt, const QuantizationConfig& q,
                                                    const std::string& prefix, int64_t N, int64_t K) {
  MOESQ_CHECK(K % format::kDenseScaleBlock == 0, "tensor ", prefix, ": K = ", K, " is not a multiple of ",
              format::kDenseScaleBlock);
  const float gs = scalar_scale(ckpt, prefix + kWeightGlobalScale);
  const std::vector<uint8_t> scales = scales_per_16(ckpt, ct_group_of_projection(ckpt, q, prefix).scale_group, prefix, N, K);
  if (q.layout == CheckpointLayout::CtPairBitmask) {
    PairBitmaskTensor b;
    b.N = N;
    b.K = K;
    b.packed = bytes_of(tensor(ckpt, prefix + kWeightSparsePacked, DType::U8, {N, K / 4}));
    b.mask = bytes_of(tensor(ckpt, prefix + kWeightSparseMask, DType::U8, {N, K / 16}));
    b.scales = scales;
    b.global_scale = gs;
    return pair_bitmask_to_sparse48(b, prefix);
  }
  MOESQ_CHECK(q.layout == CheckpointLayout::CtNvfp4, "tensor ", prefix, " in ", ckpt.dir(),
              ": not an NVFP4 layout (format \"", q.format_name, "\")");
  format::Nvfp4Tensor d;
  d.N = N;
  d.K = K;
  d.values = bytes_of(tensor(ckpt, prefix + kWeightPacked, DType::U8, {N, K / 2}));
  d.scales = scales;
  d.global_scale = gs;
  if (auto s = detect_sparse48(d)) return std::move(*s);
  return d;
}

std::vector<float> read_int4_weight(const Checkpoint& ckpt, const QuantizationConfig& q, const std::string& prefix,
                                    int64_t N, int64_t K) {
  const int64_t G = ct_group_of_projection(ckpt, q, prefix).weight_group, words = (K + 7) / 8, groups = (K + G - 1) / G;
  MOESQ_CHECK(G > 0, "tensor ", prefix, ": INT4 group size ", G, " is not positive");
  MOESQ_CHECK(!ckpt.has(prefix + ".weight_zero_point"), "tensor ", prefix, ".weight_zero_point in ", ckpt.dir(),
              ": asymmetric INT4 is not supported");
  if (ckpt.has(prefix + kWeightShape)) {
    const std::vector<float> shape = to_f32(ckpt.get(prefix + kWeightShape));
    MOESQ_CHECK(shape.size() == 2 && shape[0] == static_cast<float>(N) && shape[1] == static_cast<float>(K), "tensor ",
                prefix, kWeightShape, " in ", ckpt.dir(), " does not say [", N, ", ", K, "]");
  }
  const TensorView& p = tensor(ckpt, prefix + kWeightPacked, DType::I32, {N, words});
  const TensorView& st = ckpt.get(prefix + kWeightScale);
  TensorView want;
  want.shape = {N, groups};
  MOESQ_CHECK(st.shape == want.shape, "tensor ", prefix, kWeightScale, " in ", ckpt.dir(), " has shape ",
              st.shape_str(), ", expected ", want.shape_str());
  const std::vector<float> scale = to_f32_finite(st);
  std::vector<float> out(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      uint32_t word;
      std::memcpy(&word, p.data + 4 * (n * words + k / 8), 4);
      const int v = static_cast<int>((word >> (4 * (k % 8))) & 0xfu) - 8;
      const float s = scale[n * groups + k / G];
      out[n * K + k] = round_bf16(static_cast<float>(v) * s);
      // A finite scale near the bf16 maximum still overflows once multiplied by a code up to -8.
      MOESQ_CHECK(std::isfinite(out[n * K + k]), "tensor ", prefix, kWeightScale, " in ", ckpt.dir(), ": scale ", s,
                  " at [", n, ", ", k / G, "] times INT4 code ", v, " overflows bf16");
    }
  return out;
}

bool has_packed_projection(const Checkpoint& ckpt, const std::string& prefix) {
  return ckpt.has(prefix + kWeightPacked) || ckpt.has(prefix + kWeightSparsePacked);
}

std::vector<float> read_expert_weight_f32(const Checkpoint& ckpt, const QuantizationConfig& q,
                                          const std::string& prefix, int64_t N, int64_t K, ExpertStorage* storage) {
  if (ckpt.has(prefix + kWeight)) {
    if (storage) *storage = ExpertStorage::Dense;
    return ckpt.get_f32(prefix + kWeight, {N, K});
  }
  MOESQ_CHECK(has_packed_projection(ckpt, prefix), "tensor ", prefix, ".weight (or ", prefix,
              ".weight_packed) not found in ", ckpt.dir());
  if (q.layout == CheckpointLayout::CtInt4) {
    if (storage) *storage = ExpertStorage::Int4;
    return read_int4_weight(ckpt, q, prefix, N, K);
  }
  const format::PackedWeight p = read_packed_weight(ckpt, q, prefix, N, K);
  if (storage) *storage = p.is_sparse48() ? ExpertStorage::Sparse48 : ExpertStorage::Nvfp4;
  return p.dequantize();
}

ProjectionStorage read_projection_storage(const Checkpoint& ckpt, const QuantizationConfig& q,
                                          const std::string& prefix, int64_t N, int64_t K) {
  ProjectionStorage r;
  for (const char* suffix : {kWeight, kWeightPacked, kWeightMeta, kWeightScale, kWeightGlobalScale, kInputGlobalScale,
                             kWeightSparsePacked, kWeightSparseMask, kWeightShape})
    if (ckpt.has(prefix + suffix)) r.bytes += ckpt.get(prefix + suffix).nbytes;
  if (ckpt.has(prefix + kWeight)) {
    r.storage = ExpertStorage::Dense;
  } else if (q.layout == CheckpointLayout::CtInt4) {
    MOESQ_CHECK(has_packed_projection(ckpt, prefix), "tensor ", prefix, kWeightPacked, " not found in ", ckpt.dir());
    (void)read_int4_weight(ckpt, q, prefix, N, K);  // validates dtypes, shapes and scales
    r.storage = ExpertStorage::Int4;
  } else {
    MOESQ_CHECK(has_packed_projection(ckpt, prefix), "tensor ", prefix, ".weight (or ", prefix,
                ".weight_packed) not found in ", ckpt.dir());
    r.storage = read_packed_weight(ckpt, q, prefix, N, K).is_sparse48() ? ExpertStorage::Sparse48 : ExpertStorage::Nvfp4;
  }
  return r;
}

int deployed_act_block(const QuantizationConfig& q, int64_t num_sparse48, int64_t num_nvfp4) {
  if (q.layout == CheckpointLayout::Moesq || q.storage == ExpertStorage::Int4) return q.act_block;
  if (q.act_group == format::kSparseScaleBlock) return format::kSparseScaleBlock;  // stated by the config
  return num_nvfp4 == 0 && num_sparse48 > 0 ? format::kSparseScaleBlock : format::kDenseScaleBlock;
}

const char* expert_storage_name(ExpertStorage s) {
  switch (s) {
    case ExpertStorage::Dense: return "bf16";
    case ExpertStorage::Sparse48: return "paired-4:8-nvfp4";
    case ExpertStorage::Nvfp4: return "nvfp4";
    case ExpertStorage::Int4: return "int4";
  }
  return "?";
}

const char* checkpoint_layout_name(CheckpointLayout l) {
  switch (l) {
    case CheckpointLayout::Moesq: return "moesq";
    case CheckpointLayout::CtNvfp4: return "compressed-tensors/nvfp4-pack-quantized";
    case CheckpointLayout::CtPairBitmask: return "compressed-tensors/nvfp4-pack-quantized+pair-bitmask";
    case CheckpointLayout::CtInt4: return "compressed-tensors/pack-quantized";
  }
  return "?";
}

}  // namespace moesq::io
