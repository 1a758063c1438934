// Typed reads of config.json keys with errors naming the file and the key, shared by the common
// decoder keys (io/config.cpp) and the per-family parsers (io/config_families.cpp).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace moesq::io::config_keys {

using nlohmann::json;

// The value of `key`, or nullptr when absent or null (transformers writes null for "not set").
inline const json* find(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

inline int64_t get_int(const json& v, const std::string& key, const std::string& source) {
  MOESQ_CHECK(v.is_number_integer(), source, ": key \"", key, "\" must be an integer, got ", v.dump());
  return v.get<int64_t>();
}

inline int64_t require_int(const json& j, const char* key, const std::string& source) {
  const json* v = find(j, key);
  MOESQ_CHECK(v, source, ": missing key \"", key, "\"");
  return get_int(*v, key, source);
}

inline int64_t require_positive(const json& j, const char* key, const std::string& source) {
  const int64_t v = require_int(j, key, source);
  MOESQ_CHECK(v > 0, source, ": key \"", key, "\" must be positive, got ", v);
  return v;
}

inline double get_double(const json& v, const std::string& key, const std::string& source) {
  MOESQ_CHECK(v.is_number(), source, ": key \"", key, "\" must be a number, got ", v.dump());
  return v.get<double>();
}

inline bool get_bool(const json& v, const std::string& key, const std::string& source) {
  MOESQ_CHECK(v.is_boolean(), source, ": key \"", key, "\" must be true or false, got ", v.dump());
  return v.get<bool>();
}

// `key` if present (a bool), else `fallback`.
inline bool bool_or(const json& j, const char* key, bool fallback, const std::string& source) {
  const json* v = find(j, key);
  return v ? get_bool(*v, key, source) : fallback;
}

}  // namespace moesq::io::config_keys
