// Checkpoint directories: config.json + model.safetensors, or shards + model.safetensors.index.json.
// Non-obvious decision: with an index, the index is the source of truth — every tensor it names
// must be in the named shard (else an error naming tensor and shard), tensors a shard holds but the
// index omits are invisible, as in transformers. A lone model.safetensors wins over an index, which
// is the order transformers looks for them in.
#include "io/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/atomic_file.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace moesq::io {

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  MOESQ_CHECK(in, "cannot read ", path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    MOESQ_FAIL(path.string(), ": malformed JSON: ", e.what());
  }
}

std::string shard_name(size_t idx, size_t count) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", idx + 1, count);
  return buf;
}

}  // namespace

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const fs::path root(dir);
  MOESQ_CHECK(fs::is_directory(root), "checkpoint directory ", dir, " does not exist or is not a directory");
  const fs::path config_path = root / "config.json";
  MOESQ_CHECK(fs::is_regular_file(config_path), "checkpoint ", dir, " has no config.json");
  raw_config_ = read_json(config_path);
  config_ = unwrap_text_config(raw_config_, config_path.string(), &layout_);
  spec_ = parse_config(config_, config_path.string() + (layout_.nested() ? " text_config" : ""));

  const fs::path single = root / kSingleFile;
  const fs::path index_path = root / kIndexFile;
  if (fs::is_regular_file(single)) {
    shards_.push_back(std::make_unique<SafetensorsFile>(single.string()));
    for (const std::string& name : shards_.back()->names()) where_[name] = shards_.back().get();
    index_flat_names();
    return;
  }
  MOESQ_CHECK(fs::is_regular_file(index_path), "checkpoint ", dir, " has neither ", kSingleFile,
              " nor ", kIndexFile);
  const nlohmann::json index = read_json(index_path);
  const std::string index_str = index_path.string();
  MOESQ_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
              index_str, ": missing \"weight_map\" object");
  std::map<std::string, const SafetensorsFile*> by_shard;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    const std::string& tensor = it.key();
    MOESQ_CHECK(it.value().is_string(), index_str, ": weight_map entry of tensor ", tensor,
                " is not a file name");
    const std::string shard = it.value().get<std::string>();
    // Shards live next to the index: a path component would escape the checkpoint directory.
    MOESQ_CHECK(!shard.empty() && fs::path(shard).filename() == shard && shard != "." && shard != "..",
                index_str, ": shard \"", shard, "\" of tensor ", tensor, " is not a plain file name");
    auto found = by_shard.find(shard);
    if (found == by_shard.end()) {
      const fs::path shard_path = root / shard;
      MOESQ_CHECK(fs::is_regular_file(shard_path), index_str, " names shard ", shard,
                  " (for tensor ", tensor, "), which does not exist in ", dir);
      shards_.push_back(std::make_unique<SafetensorsFile>(shard_path.string()));
      found = by_shard.emplace(shard, shards_.back().get()).first;
    }
    MOESQ_CHECK(found->second->has(tensor), "tensor ", tensor, " is listed in ", index_str,
                " but missing from shard ", shard);
    where_[tensor] = found->second;
  }
  index_flat_names();
}

void Checkpoint::index_flat_names() {
  const bool fused = has_fused_qwen_experts(spec_);
  // A wrapper config over tensors saved without the prefix (a text model re-saved with the wrapper's
  // config): read them as they are, and write new tensors the same way.
  if (layout_.nested() && std::none_of(where_.begin(), where_.end(), [&](const auto& kv) {
        return kv.first.rfind(layout_.text_prefix, 0) == 0;
      }))
    layout_.text_prefix.clear();
  auto claim = [&](const std::string& flat, const std::string& stored) {
    MOESQ_CHECK(!stored_.count(flat) && !views_.count(flat), dir_, ": tensor ", stored, " and tensor ",
                stored_.count(flat) ? stored_.at(flat) : views_.at(flat).file, " both stand for ", flat,
                " (a checkpoint holds each tensor once, fused or per expert)");
  };
  for (const auto& [stored, file] : where_) {
    const std::string flat = flat_tensor_name(layout_, stored);
    if (fused) {
      std::vector<TensorView> parts = split_fused_experts(spec_, flat, file->get(stored));
      for (TensorView& v : parts) {
        claim(v.name, stored);
        views_.emplace(v.name, std::move(v));
      }
      if (!parts.empty()) continue;
    }
    claim(flat, stored);
    stored_.emplace(flat, stored);
  }
}

const TensorView& Checkpoint::get(const std::string& name) const {
  if (auto v = views_.find(name); v != views_.end()) return v->second;
  auto it = stored_.find(name);
  MOESQ_CHECK(it != stored_.end(), "tensor ", name, " not found in ", dir_,
              layout_.nested() ? " (stored as " + hub_tensor_name(layout_, name) + ")" : std::string());
  return where_.at(it->second)->get(it->second);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(stored_.size() + views_.size());
  for (const auto& [name, stored] : stored_) out.push_back(name);
  for (const auto& [name, view] : views_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Checkpoint::stored_name(const std::string& name) const {
  if (auto it = stored_.find(name); it != stored_.end()) return it->second;
  return hub_tensor_name(layout_, name);
}

std::vector<float> Checkpoint::get_f32(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorView& t = get(name);
  if (t.shape != shape) {
    TensorView want;
    want.shape = shape;
    MOESQ_FAIL(t.file, ": tensor ", name, " has shape ", t.shape_str(), ", expected ", want.shape_str());
  }
  return to_f32_finite(t);
}

std::vector<std::string> Checkpoint::shard_files() const {
  std::vector<std::string> out;
  for (const auto& s : shards_) out.push_back(fs::absolute(s->path()).lexically_normal().string());
  return out;
}

size_t parse_shard_size(const std::string& text, const std::string& flag) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string unit = text.substr(digits);
  static const std::map<std::string, uint64_t> units = {{"", 1},           {"B", 1},
                                                        {"KB", 1000},      {"MB", 1000000},
                                                        {"GB", 1000000000}, {"KiB", uint64_t(1) << 10},
                                                        {"MiB", uint64_t(1) << 20}, {"GiB", uint64_t(1) << 30}};
  const auto u = units.find(unit);
  MOESQ_CHECK(digits > 0 && digits <= 12 && u != units.end(), flag, " is \"", text,
              "\"; expected a byte count, optionally with B, KB, MB, GB, KiB, MiB or GiB (e.g. 5GB)");
  const uint64_t n = std::stoull(text.substr(0, digits)) * u->second;
  MOESQ_CHECK(n > 0, flag, " is \"", text, "\"; a shard must hold at least one byte");
  return static_cast<size_t>(n);
}

void write_checkpoint_tensors(const std::string& dir, const SafetensorsWriter& all, size_t max_shard_bytes) {
  MOESQ_CHECK(max_shard_bytes > 0, "write_checkpoint_tensors: max_shard_bytes must be positive");
  MOESQ_CHECK(fs::is_directory(dir), "write_checkpoint_tensors: output directory ", dir, " does not exist");
  // Greedy in name order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<std::string>> shards;
  size_t current = 0;
  for (const std::string& name : all.names()) {
    const size_t n = all.nbytes(name);
    if (shards.empty() || (!shards.back().empty() && current + n > max_shard_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(name);
    current += n;
  }
  // transformers refuses safetensors files whose metadata lacks format ∈ {pt, tf, flax, mlx}.
  const std::map<std::string, std::string> extra{{"format", "pt"}};
  const fs::path root(dir);
  if (shards.size() <= 1) {
    all.write_subset((root / kSingleFile).string(), shards.empty() ? std::vector<std::string>{} : shards[0],
                     extra);
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  int64_t total_params = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file = shard_name(i, shards.size());
    all.write_subset((root / file).string(), shards[i], extra);
    for (const std::string& name : shards[i]) {
      weight_map[name] = file;
      total_params += all.numel(name);
    }
  }
  const nlohmann::json index = {
      {"metadata", {{"total_size", all.data_bytes()}, {"total_parameters", total_params}}},
      {"weight_map", weight_map}};
  write_file_atomic((root / kIndexFile).string(), index.dump(2) + "\n");
}

}  // namespace moesq::io
