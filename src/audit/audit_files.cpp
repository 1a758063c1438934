// JSON file helpers of the audit (audit_files.h).
#include "audit/audit_files.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace moesq::audit::detail {

nlohmann::json read_json(const std::string& path) {
  std::error_code ec;
  // A directory opens as an ifstream and failed later as an uncaught std::ios_base::failure.
  MOESQ_CHECK(!std::filesystem::is_directory(path, ec), path, " is a directory, not a JSON file");
  std::ifstream f(path);
  MOESQ_CHECK(f.good(), "cannot read ", path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    MOESQ_FAIL(path, ": invalid JSON (", e.what(), ")");
  }
}

}  // namespace moesq::audit::detail
