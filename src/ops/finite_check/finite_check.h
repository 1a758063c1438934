// Launcher: the first non-finite value (NaN, +inf, −inf) of an activation tensor, folded into ONE 8-byte
// device record that every check of a forward shares. The record keeps the SMALLEST key
//   key = site · 2^48 | group · 2^32 | row · 2^2 | kind
// of every non-finite value any check saw, so with sites numbered in forward order it names the first
// stage that went bad, then its lowest group (expert) and row (token) — whatever the launch, CTA or
// thread order (atomicMin: the same record on every run). A check whose site a finding already beats
// returns at once, so a NaN that spread through every later stage costs one read per CTA there.
// kFiniteRecordNone (all ones; no key has kind 3) = nothing found: the caller sets it once and again
// after reading a finding (the runtime's debug check, runtime/finite_check.h).
// Grouped tensors (a MoE block's per-expert buffers [groups, capacity, ld]): group g's rows are its
// first counts[g] (clamped to capacity) — the slots past them hold stale data and are never read — and
// a row is reported as row_ids[g·capacity + slot] / row_div (the route id r = token·k + j → the token).
// Values are classified on their bits (exponent all ones), never by float compares, so fast-math
// flags cannot hide a NaN. CPU twin: finite_check_ref, the same key on host pointers.
#pragma once
#include <cstdint>

#include "core/cuda/stream.h"

#ifdef __CUDACC__
#define MOESQ_FINITE_HD __host__ __device__
#else
#define MOESQ_FINITE_HD
#endif

namespace moesq::ops {

enum class FiniteKind : uint32_t { kNan = 0, kPosInf = 1, kNegInf = 2 };

constexpr uint64_t kFiniteRecordNone = ~0ull;
constexpr uint32_t kFiniteMaxSite = 0xfffe;           // 16 bits; 0xffff belongs to the empty record
constexpr int64_t kFiniteMaxGroups = 0x10000;         // group < 2^16
constexpr int64_t kFiniteMaxRow = (int64_t(1) << 30) - 1;  // row < 2^30

MOESQ_FINITE_HD constexpr uint64_t finite_key(uint32_t site, uint32_t group, uint32_t row, FiniteKind kind) {
  return (uint64_t(site) << 48) | (uint64_t(group & 0xffffu) << 32) | (uint64_t(row & 0x3fffffffu) << 2) |
         uint64_t(kind);
}
static_assert(finite_key(kFiniteMaxSite, 0xffff, 0x3fffffff, FiniteKind::kNegInf) < kFiniteRecordNone,
              "every key sorts before the empty record");
static_assert(finite_key(1, 0, 0, FiniteKind::kNan) > finite_key(0, 0xffff, 0x3fffffff, FiniteKind::kNegInf),
              "the site is the most significant part of the key");

// The non-finite class of a bf16 / fp32 value from its bits: 0 NaN, 1 +inf, 2 −inf, −1 finite.
MOESQ_FINITE_HD constexpr int finite_class_bf16(uint16_t u) {
  return (u & 0x7f80u) != 0x7f80u ? -1 : (u & 0x007fu) ? 0 : (u & 0x8000u) ? 2 : 1;
}
MOESQ_FINITE_HD constexpr int finite_class_f32(uint32_t u) {
  return (u & 0x7f800000u) != 0x7f800000u ? -1 : (u & 0x007fffffu) ? 0 : (u & 0x80000000u) ? 2 : 1;
}

// A record read back: found == false for kFiniteRecordNone.
struct FiniteFinding {
  bool found = false;
  uint32_t site = 0;
  int64_t group = 0;
  int64_t row = 0;
  FiniteKind kind = FiniteKind::kNan;
};
FiniteFinding decode_finite_key(uint64_t key);
const char* finite_kind_name(FiniteKind kind);  // "NaN", "+inf", "-inf"

struct FiniteCheckArgs {
  const float* x_f32 = nullptr;      // [rows or groups·capacity, ld] fp32, or
  const uint16_t* x_bf16 = nullptr;  // the same in bf16 (exactly one of the two)
  int64_t rows = 0;                  // ungrouped: rows of cols values, row stride ld
  int64_t cols = 0, ld = 0;          // ld ≥ cols
  // Grouped (groups > 0; rows unused): [groups, capacity, ld], group g's valid rows its first counts[g].
  int64_t groups = 0, capacity = 0;
  const int32_t* counts = nullptr;   // [groups]
  const int32_t* row_ids = nullptr;  // [groups, capacity] the id reported for a slot (a route id), or nullptr: the slot
  int row_div = 1;                   // reported row = row_ids[·] / row_div (route → token: top-k)
  int64_t row0 = 0;                  // added to every reported row (the tensor is a slice of a larger batch)
  int64_t group0 = 0;                // added to every reported group (the groups are a slice of the experts: a shard)
  uint32_t site = 0;                 // ≤ kFiniteMaxSite: this check's place in the forward (smaller = earlier)
  uint64_t* record = nullptr;        // [1] the shared record (device; host for the twin)
};

// Errors: both or neither input, cols < 1, ld < cols, rows / capacity outside [0, 2^30), groups outside
// [0, 2^16], grouped without counts, row_div < 1, site > kFiniteMaxSite, no record. rows (or groups·capacity)
// == 0: nothing.
void finite_check(const FiniteCheckArgs& args, cudaStream_t stream);
void finite_check_ref(const FiniteCheckArgs& args);  // host pointers
void finite_check_check(const FiniteCheckArgs& args);

}  // namespace moesq::ops
