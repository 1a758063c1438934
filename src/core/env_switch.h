// Environment switches of the GPU schedule (each the same-run peer of an optimization, bench/NOTES.md):
// read by the caller once per process (a function-local static), so a graph captured later launches
// what the eager step did.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace moesq {

// The switch `name`: `fallback` when unset, false when set to "0", true when set to anything else.
inline bool env_switch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  return std::strcmp(v, "0") != 0;
}
// A switch that is on unless set to "0".
inline bool env_switch_on(const char* name) { return env_switch(name, true); }

// The variable `name` as an integer in [lo, hi], or `fallback` when it is unset, not a whole number or
// outside the range.
inline int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  return (end && *end == 0 && x >= lo && x <= hi) ? static_cast<int64_t>(x) : fallback;
}

}  // namespace moesq
