// JSON file helpers of the audit (audit_files.h).
#include "audit/audit_files.h"

#include <fstream>

#include "core/error.h"

namespace moesq::moe::detail {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  MOESQ_CHECK(f.good(), "cannot read ", path);
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    MOESQ_FAIL(path, ": invalid JSON (", e.what(), ")");
  }
}

}  // namespace moesq::moe::detail
