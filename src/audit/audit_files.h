// Internal to src/audit: the surface names every run writes and the JSON file helpers the writer, the
// scorer, the self-test and the study share (one text form: non-ASCII replaced, never an exception).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace moesq::audit::detail {

inline const char* const kSurfaceNames[] = {"w13_out", "activation", "w2_out", "final"};

// The JSON text of `j` (indent −1: one line), invalid UTF-8 replaced rather than thrown on.
inline std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Parses the JSON file at `path`; Error names the path (unreadable or invalid JSON).
nlohmann::json read_json(const std::string& path);

}  // namespace moesq::audit::detail
