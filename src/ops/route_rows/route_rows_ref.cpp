// CPU twin of the route_rows launcher (route_rows.h) and of the exchange between its pack and unpack.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "ops/route_rows/route_rows.h"

namespace moesq::ops {

void route_rows_check(const RouteRowsArgs& a) {
  MOESQ_CHECK(a.T >= 0 && a.H > 0 && a.H % 2 == 0 && a.ldy >= a.H && a.ldy % 2 == 0, "route_rows: bad shape T=",
              a.T, " H=", a.H, " ldy=", a.ldy, " (H and ldy must be even, ldy >= H)");
  MOESQ_CHECK(a.topk >= 1 && a.topk <= 32 && a.num_experts >= 1 && a.capacity >= 0, "route_rows: bad routing k=",
              a.topk, " E=", a.num_experts, " capacity=", a.capacity, " (k in [1, 32])");
  MOESQ_CHECK(a.expert_begin >= 0 && a.expert_begin <= a.expert_end && a.expert_end <= a.num_experts,
              "route_rows: expert range [", a.expert_begin, ", ", a.expert_end, ") outside [0, ", a.num_experts, "]");
  MOESQ_CHECK(a.T == 0 || (a.y && a.topk_ids && a.slot_of_route && a.routes), "route_rows: null pointer");
}

void route_rows_ref(const RouteRowsArgs& a) {
  route_rows_check(a);
  for (int64_t q = 0; q < a.T * a.topk; ++q) {
    const int32_t e = a.topk_ids[q], s = a.slot_of_route[q];
    MOESQ_CHECK(e >= 0 && e < a.num_experts, "route_rows: route ", q, " names expert ", e, " of ", a.num_experts);
    MOESQ_CHECK(s < a.capacity, "route_rows: route ", q, " has slot ", s, " past the capacity ", a.capacity);
    uint16_t* row = a.routes + q * a.H;
    uint16_t* yrow = s >= 0 ? a.y + (static_cast<int64_t>(e) * a.capacity + s) * a.ldy : nullptr;
    if (a.pack) {
      if (yrow && e >= a.expert_begin && e < a.expert_end) std::copy_n(yrow, a.H, row);
      else std::fill_n(row, a.H, uint16_t{0});
    } else if (yrow) {
      std::copy_n(row, a.H, yrow);
    }
  }
}

void route_rows_sum_ref(const uint16_t* const* parts, int num_ranks, int64_t words, int64_t H, uint16_t* out) {
  MOESQ_CHECK(num_ranks >= 1 && words >= 0 && H > 0 && H % 2 == 0, "route_rows exchange: bad sizes ranks=",
              num_ranks, " words=", words, " H=", H);
  for (int64_t w = 0; w < words; ++w) {
    uint32_t sum = 0;
    int owners = 0;
    for (int r = 0; r < num_ranks; ++r) {
      uint32_t v;
      std::memcpy(&v, parts[r] + 2 * w, 4);
      owners += v != 0;
      sum += v;  // the all-reduce's integer sum (wraps like ncclUint32; exact with one owner)
    }
    MOESQ_CHECK(owners <= 1, "route_rows exchange: route row ", 2 * w / H, " was packed by ", owners,
                " ranks (each expert must have one owner)");
    std::memcpy(out + 2 * w, &sum, 4);
  }
}

}  // namespace moesq::ops
