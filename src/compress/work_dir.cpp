#include "compress/work_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/hash.h"

namespace fs = std::filesystem;

namespace moesq::compress {

namespace {

constexpr const char* kFormat = "moesq compress work dir 1";

// SHA-256 of the calibration: every sequence's length (int64) then its int32 tokens.
std::string calibration_sha256(const CalibSet& calib) {
  std::string bytes;
  for (const std::vector<int32_t>& s : calib.sequences) {
    const int64_t n = static_cast<int64_t>(s.size());
    bytes.append(reinterpret_cast<const char*>(&n), sizeof n);
    bytes.append(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(int32_t));
  }
  return sha256_hex(bytes.data(), bytes.size());
}

// Leaves of a JSON object as "a.b.c" → value (arrays are leaves).
void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, nlohmann::json>& out) {
  if (!j.is_object()) {
    out[prefix] = j;
    return;
  }
  for (auto it = j.begin(); it != j.end(); ++it) flatten(it.value(), prefix.empty() ? it.key() : prefix + "." + it.key(), out);
}

// "key (committed X, now Y); …" for every leaf that differs, "" when none does.
std::string manifest_differences(const nlohmann::json& committed, const nlohmann::json& now) {
  std::map<std::string, nlohmann::json> a, b;
  flatten(committed, "", a);
  flatten(now, "", b);
  std::string diff;
  auto show = [](const std::map<std::string, nlohmann::json>& m, const std::string& k) {
    const auto it = m.find(k);
    return it == m.end() ? std::string("absent") : it->second.dump();
  };
  std::map<std::string, bool> keys;
  for (const auto& [k, v] : a) keys[k] = true;
  for (const auto& [k, v] : b) keys[k] = true;
  for (const auto& [k, unused] : keys) {
    const auto ia = a.find(k), ib = b.find(k);
    if (ia != a.end() && ib != b.end() && ia->second == ib->second) continue;
    if (!diff.empty()) diff += "; ";
    diff += k + " (committed " + show(a, k) + ", now " + show(b, k) + ")";
  }
  return diff;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MOESQ_CHECK(f, "cannot read ", path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

nlohmann::json run_manifest(const io::Checkpoint& src, const CalibSet& calib, const CompressOptions& opt) {
  nlohmann::json options = {{"sgptq",
                             {{"percdamp", opt.sgptq.percdamp},
                              {"block_size", opt.sgptq.block_size},
                              {"min_tokens", opt.sgptq.min_tokens},
                              {"pattern_at_group", opt.sgptq.pattern_at_group}}}};
  if (opt.method->options_json) options[opt.method->manifest_key] = opt.method->options_json(opt);
  // Where the refinement ran changes the bits; the CPU (the only device before there was a choice)
  // is left out, so a work dir committed by an earlier moesq still resumes.
  if (opt.device != Device::kCpu) options["device"] = device_name(opt.device);
  nlohmann::json files = nlohmann::json::object();
  std::vector<std::string> paths = src.shard_files();
  paths.push_back((fs::path(src.dir()) / "config.json").string());
  const fs::path index = fs::path(src.dir()) / "model.safetensors.index.json";
  if (fs::exists(index)) paths.push_back(index.string());
  for (const std::string& p : paths) files[fs::path(p).filename().string()] = sha256_file(p);
  return {{"format", kFormat},
          {"method", opt.method->name},
          {"options", options},
          {"calibration",
           {{"sequences", calib.sequences.size()}, {"tokens", calib.tokens()}, {"sha256", calibration_sha256(calib)}}},
          {"source", files}};
}

std::string work_dir_path(const std::string& out) {
  std::string o = out;
  while (o.size() > 1 && o.back() == '/') o.pop_back();
  return o + ".work";
}

WorkDir::WorkDir(const std::string& out, const nlohmann::json& manifest, bool resume) : dir_(work_dir_path(out)) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  MOESQ_CHECK(!ec && fs::is_directory(dir_), "cannot create the work directory ", dir_, " (beside --out ", out,
              "): ", ec ? ec.message() : "a file of that name exists");
  const std::string lock = (fs::path(dir_) / "lock").string();
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  MOESQ_CHECK(lock_fd_ >= 0, "cannot open ", lock, ": ", std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    MOESQ_FAIL("work directory ", dir_, " is in use by another moesq compress writing --out ", out);
  }
  try {
    open_records(manifest, resume);
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
  update_interrupt_rule();
}

void WorkDir::update_interrupt_rule() {
  if (committed_ == 0) {
    interrupt_ = OnInterrupt::remove(dir_);
    return;
  }
  interrupt_ = OnInterrupt::say([dir = dir_, n = committed_] {
    return "compress: kept " + dir + " (" + std::to_string(n) + " layer" + (n == 1 ? "" : "s") +
           " committed); run the same command with --resume to continue there";
  });
}

void WorkDir::open_records(const nlohmann::json& manifest, bool resume) {
  const std::string manifest_path = (fs::path(dir_) / "manifest.json").string();
  const std::string text = manifest.dump();
  run_sha256_ = sha256_hex(text.data(), text.size());
  while (fs::exists(record_path(committed_))) ++committed_;
  if (committed_ > 0 && !resume) {
    // A fresh run replaces OUT, and so the work of an earlier run of OUT: said, not silent.
    std::fprintf(stderr, "WARNING: discarding %lld committed layer(s) of an earlier interrupted run in %s "
                         "(pass --resume to continue it instead)\n", static_cast<long long>(committed_), dir_.c_str());
    for (int64_t l = 0; l < committed_; ++l) fs::remove(record_path(l));
    committed_ = 0;
  }
  if (committed_ > 0) {
    MOESQ_CHECK(fs::exists(manifest_path), "--resume: ", dir_, " has committed layers but no manifest.json; delete ",
                dir_, " to start over");
    nlohmann::json committed;
    try {
      committed = nlohmann::json::parse(read_file(manifest_path));
    } catch (const nlohmann::json::exception& e) {
      MOESQ_FAIL("--resume: ", manifest_path, " is not valid JSON (", e.what(), "); delete ", dir_, " to start over");
    }
    const std::string diff = manifest_differences(committed, manifest);
    MOESQ_CHECK(diff.empty(), "--resume: ", dir_, " was committed with different settings: ", diff,
                ". Run with the committed settings, or delete ", dir_, " to start over");
  } else {
    write_file_atomic(manifest_path, manifest.dump(2) + "\n");  // nothing (left) committed
  }
}

WorkDir::~WorkDir() {
  // A run that failed before committing any layer leaves nothing behind (nothing to resume).
  std::error_code ec;
  if (committed_ == 0 && !removed_) fs::remove_all(dir_, ec);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string WorkDir::record_path(int64_t layer) const {
  char name[32];
  std::snprintf(name, sizeof name, "layer_%04lld.rec", static_cast<long long>(layer));
  return (fs::path(dir_) / name).string();
}

LayerRecord WorkDir::load(int64_t layer) const {
  MOESQ_CHECK(layer >= 0 && layer < committed_, "work dir: layer ", layer, " is not committed");
  const std::string path = record_path(layer);
  LayerRecord r = decode_layer_record(read_file(path), path);
  MOESQ_CHECK(r.layer == layer, path, " holds layer ", r.layer, ", not ", layer, "; delete ", dir_, " to start over");
  MOESQ_CHECK(r.run_sha256 == run_sha256_, path, " was committed by a run with another manifest; delete ", dir_,
              " to start over");
  return r;
}

void WorkDir::commit(LayerRecord r) {
  MOESQ_CHECK(r.layer == committed_, "work dir: committing layer ", r.layer, " after ", committed_, " committed layers");
  r.run_sha256 = run_sha256_;
  // The record's rename and the switch from "remove the dir" to "keep it, say --resume" are one step
  // for an interrupt: without the hold, a SIGINT right after the rename removed the committed layer.
  const auto hold = hold_interrupts();
  write_file_atomic(record_path(r.layer), encode_layer_record(r));
  ++committed_;
  update_interrupt_rule();
}

void WorkDir::remove() {
  interrupt_.dismiss();
  std::error_code ec;
  fs::remove_all(dir_, ec);
  removed_ = true;
  MOESQ_CHECK(!ec, "cannot remove the work directory ", dir_, ": ", ec.message());
}

}  // namespace moesq::compress
