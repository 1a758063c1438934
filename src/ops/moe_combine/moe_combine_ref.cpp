// CPU twin of ops::moe_combine.
#include <algorithm>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "ops/moe_combine/moe_combine.h"

namespace moesq::ops {

void moe_combine_check(const MoeCombineArgs& a) {
  MOESQ_CHECK(a.topk >= 1 && a.topk <= 32 && a.num_experts > 0 && a.capacity >= 0 && a.T >= 0 && a.H > 0 &&
                  a.ldy >= a.H,
              "moe_combine: bad sizes T=", a.T, " H=", a.H, " ldy=", a.ldy, " k=", a.topk, " E=", a.num_experts,
              " capacity=", a.capacity);
  if (a.fused_norm)
    MOESQ_CHECK(a.fused_norm->x == a.h && a.fused_norm->n == a.T && a.fused_norm->D == a.H && a.fused_norm->w &&
                    (a.fused_norm->y || a.fused_norm->y_f32),
                "moe_combine: fused_norm must normalize h's [T=", a.T, ", H=", a.H, "] rows (got x ",
                a.fused_norm->x == a.h ? "h" : "another buffer", ", n=", a.fused_norm->n, ", D=", a.fused_norm->D,
                ") with a weight and an output");
}

void invert_route_of_slot(const int32_t* route_of_slot, const int32_t* counts, int num_experts, int capacity,
                          int64_t routes, int32_t* slot_of_route) {
  std::fill(slot_of_route, slot_of_route + routes, -1);
  for (int e = 0; e < num_experts; ++e) {
    const int n = std::clamp(counts[e], 0, capacity);
    for (int s = 0; s < n; ++s) {
      const int32_t r = route_of_slot[static_cast<int64_t>(e) * capacity + s];
      MOESQ_CHECK(r >= 0 && r < routes, "invert_route_of_slot: expert ", e, " slot ", s, " holds route ", r,
                  " outside [0, ", routes, ")");
      slot_of_route[r] = s;
    }
  }
}

void moe_combine_ref(const MoeCombineArgs& a) {
  moe_combine_check(a);
  std::vector<int> order(a.topk);
  for (int64_t t = 0; t < a.T; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return a.topk_ids[t * a.topk + x] < a.topk_ids[t * a.topk + y]; });
    for (int64_t c = 0; c < a.H; ++c) {
      float acc = 0.0f;
      for (int j : order) {
        const int64_t r = t * a.topk + j;
        const int s = a.slot_of_route[r];
        const int64_t e = a.topk_ids[r];
        if (s < 0 || s >= a.capacity || e < 0 || e >= a.num_experts) continue;
        float y = bf16_to_f32(a.y[(e * a.capacity + s) * a.ldy + c]);
        if (a.down_bias) y += a.down_bias[e * a.H + c];
        acc += y * a.topk_w[r];
      }
      a.h[t * a.H + c] += acc;
    }
  }
  if (a.fused_norm) rmsnorm_ref(*a.fused_norm);
}

}  // namespace moesq::ops
