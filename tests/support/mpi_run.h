// Helpers for tests that run `moesq` (or a test binary) under mpirun: the launcher command line,
// and a digest of an output directory for byte-identity checks.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/hash.h"

namespace moesq::test {

// False when no mpirun is on PATH (the only reason an MPI test may skip).
inline bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

// The environment and mpirun flags every MPI test uses: CI runs as root (--allow-run-as-root), on 2
// cores (--oversubscribe for more ranks than cores); no single-copy (CMA) transport, which needs
// ptrace rights that containers often lack. For the ASan build: Open MPI's own allocations kept
// until exit are suppressed (lsan_openmpi.supp); its plugins stay loaded (no dlclose) and stacks are
// unwound fully so that LeakSanitizer can name the library an allocation came from.
inline std::string mpirun(int ranks) {
  const std::string supp = std::string(MOESQ_FIXTURES) + "/../support/lsan_openmpi.supp";
  // Leak checking is off in the ranks (ASan's address checks stay on): LeakSanitizer's exit-time tracer
  // crashes (signal 11 while it suspends the main thread) in mpirun-launched ranks depending on the
  // binary's layout — reproduced on Debian 12's GCC 12 / Open MPI 4.1: the same test passes at 3bf6c43 and
  // fails after a bool is added to RefineOptions. The same code paths are leak-checked in one process.
  return "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_mca_base_component_disable_dlclose=1 "
         "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1 "
         "LSAN_OPTIONS=suppressions=" + supp + ":fast_unwind_on_malloc=0"
         " mpirun --allow-run-as-root --oversubscribe -np " + std::to_string(ranks) + " ";
}

// File name → SHA-256 of every file of `dir`. report.json is compared without its wall-clock fields
// ("seconds", "epoch_seconds", "calibration_seconds" at any depth): they are the only bytes that
// differ run to run.
inline std::map<std::string, std::string> dir_digest(const std::filesystem::path& dir) {
  std::map<std::string, std::string> d;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    const std::string name = f.path().filename().string();
    if (name != "report.json") {
      d[name] = sha256_file(f.path().string());
      continue;
    }
    std::ifstream in(f.path());
    nlohmann::json j = nlohmann::json::parse(in);
    auto strip = [](auto& self, nlohmann::json& x) -> void {
      if (x.is_object()) {
        x.erase("seconds");
        x.erase("epoch_seconds");
        x.erase("calibration_seconds");
      }
      if (x.is_structured())
        for (auto& v : x) self(self, v);
    };
    strip(strip, j);
    const std::string s = j.dump();
    d[name + " (without seconds)"] = sha256_hex(s.data(), s.size());
  }
  return d;
}

}  // namespace moesq::test
