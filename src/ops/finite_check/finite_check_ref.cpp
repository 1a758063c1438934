// CPU twin of ops::finite_check (finite_check.h): the same keys in plain loops over host pointers, the
// smallest folded into *record — equal to the kernel's record on every input (a minimum has no order).
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/finite_check/finite_check.h"

namespace moesq::ops {

FiniteFinding decode_finite_key(uint64_t key) {
  FiniteFinding f;
  if (key == kFiniteRecordNone) return f;
  f.found = true;
  f.site = static_cast<uint32_t>(key >> 48);
  f.group = static_cast<int64_t>((key >> 32) & 0xffffu);
  f.row = static_cast<int64_t>((key >> 2) & 0x3fffffffu);
  f.kind = static_cast<FiniteKind>(key & 3u);
  return f;
}

const char* finite_kind_name(FiniteKind kind) {
  switch (kind) {
    case FiniteKind::kNan: return "NaN";
    case FiniteKind::kPosInf: return "+inf";
    case FiniteKind::kNegInf: return "-inf";
  }
  return "non-finite value";
}

void finite_check_check(const FiniteCheckArgs& a) {
  MOESQ_CHECK((a.x_f32 != nullptr) != (a.x_bf16 != nullptr), "finite_check: give exactly one of x_f32, x_bf16");
  MOESQ_CHECK(a.cols >= 1 && a.ld >= a.cols, "finite_check: bad sizes cols=", a.cols, " ld=", a.ld);
  MOESQ_CHECK(a.groups >= 0 && a.groups <= kFiniteMaxGroups, "finite_check: groups=", a.groups, " outside [0, ",
              kFiniteMaxGroups, "]");
  const int64_t rows = a.groups > 0 ? a.capacity : a.rows;
  MOESQ_CHECK(rows >= 0 && rows <= kFiniteMaxRow, "finite_check: ", a.groups > 0 ? "capacity=" : "rows=", rows,
              " outside [0, ", kFiniteMaxRow, "]");
  MOESQ_CHECK(a.groups == 0 || a.counts, "finite_check: a grouped check needs counts");
  MOESQ_CHECK(a.row_div >= 1, "finite_check: row_div=", a.row_div, " must be >= 1");
  MOESQ_CHECK(a.row0 >= 0 && a.row0 <= kFiniteMaxRow, "finite_check: row0=", a.row0, " outside [0, ", kFiniteMaxRow,
              "]");
  MOESQ_CHECK(a.site <= kFiniteMaxSite, "finite_check: site ", a.site, " > ", kFiniteMaxSite);
  MOESQ_CHECK(a.record, "finite_check: no record");
}

namespace {

// The class of element i of the input (−1: finite).
int value_class(const FiniteCheckArgs& a, int64_t i) {
  if (a.x_bf16) return finite_class_bf16(a.x_bf16[i]);
  uint32_t u;
  std::memcpy(&u, a.x_f32 + i, 4);
  return finite_class_f32(u);
}

// Folds the smallest key of row `r` of the [·, ld] input (reported as group g, row `id`) into *record.
void check_row(const FiniteCheckArgs& a, int64_t r, int64_t g, int64_t id) {
  for (int64_t c = 0; c < a.cols; ++c) {
    const int k = value_class(a, r * a.ld + c);
    if (k < 0) continue;
    const uint64_t key =
        finite_key(a.site, static_cast<uint32_t>(g + a.group0), static_cast<uint32_t>(id + a.row0), static_cast<FiniteKind>(k));
    *a.record = std::min(*a.record, key);
  }
}

}  // namespace

void finite_check_ref(const FiniteCheckArgs& a) {
  finite_check_check(a);
  if (a.groups == 0) {
    for (int64_t r = 0; r < a.rows; ++r) check_row(a, r, 0, r);
    return;
  }
  for (int64_t g = 0; g < a.groups; ++g) {
    const int64_t n = std::clamp<int64_t>(a.counts[g], 0, a.capacity);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t slot = g * a.capacity + s;
      const int64_t r = a.row_ids ? a.row_ids[slot] : -1;
      const int64_t id = r >= 0 ? r / a.row_div : s;  // no route id: the slot itself
      check_row(a, slot, g, id);
    }
  }
}

}  // namespace moesq::ops
