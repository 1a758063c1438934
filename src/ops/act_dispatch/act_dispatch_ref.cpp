// CPU twin of act_dispatch (act_dispatch.h) on the launcher's descriptor: routes → per-expert batches in
// the canonical slot order, and the launcher's argument checks both sides share.
#include "ops/act_dispatch/act_dispatch.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "format/nvfp4.h"

namespace moesq::ops {

void act_dispatch_check(const DispatchArgs& a) {
  MOESQ_CHECK(a.K > 0 && a.K % format::kActScaleBlock == 0 && a.K_pad >= a.K && a.K_pad % 256 == 0,
              "act_dispatch: K=", a.K, " K_pad=", a.K_pad, " (K must be a multiple of 32, K_pad of 256)");
  MOESQ_CHECK(a.num_experts > 0 && a.capacity >= 0 && a.topk > 0 && a.T >= 0, "act_dispatch: bad sizes E=",
              a.num_experts, " capacity=", a.capacity, " topk=", a.topk, " T=", a.T);
  MOESQ_CHECK(a.layout == format::ActLayout::kMmaFragment || a.layout == format::ActLayout::kKMajor,
              "act_dispatch: unknown ActLayout ", static_cast<int>(a.layout));
}

void act_dispatch_ref(const DispatchArgs& a) {
  act_dispatch_check(a);
  std::fill(a.counts, a.counts + a.num_experts, 0);
  const bool f32 = a.x_lo != nullptr && a.quantize;
  std::vector<float> row_f32(f32 ? a.K : 0);  // [K] x + x_lo in fp32
  for (int64_t r = 0; r < a.T * a.topk; ++r) {
    const int e = a.topk_ids[r];
    MOESQ_CHECK(e >= 0 && e < a.num_experts, "dispatch_ref: topk_ids[", r, "]=", e, " not in [0, ", a.num_experts,
                ")");
    const int slot = a.counts[e]++;
    if (slot >= a.capacity) {  // dropped route: counted, not stored
      if (a.slot_of_route) a.slot_of_route[r] = -1;
      continue;
    }
    const int64_t s = static_cast<int64_t>(e) * a.capacity + slot;
    a.route_of_slot[s] = static_cast<int32_t>(r);
    if (a.slot_of_route) a.slot_of_route[r] = slot;
    uint16_t* out = a.out + s * a.K_pad;  // [K_pad]
    std::fill(out, out + a.K_pad, uint16_t{0});
    const int64_t t = r / a.topk;
    const float g = a.act_gamma ? a.act_gamma[e] : 0.0f;
    MOESQ_CHECK(!a.act_gamma || !a.quantize || (std::isfinite(g) && g > 0.0f), "act_dispatch_ref: act_gamma[", e,
                "]=", g, " is not a finite positive static scale");
    if (f32) {
      for (int64_t k = 0; k < a.K; ++k) row_f32[k] = bf16_to_f32(a.x[t * a.K + k]) + bf16_to_f32(a.x_lo[t * a.K + k]);
      act_quant_row_f32_ref(row_f32.data(), a.K, out, a.inv_scale + s, a.layout, g);
    } else {
      act_quant_row_ref(a.x + t * a.K, a.K, a.quantize, out, a.inv_scale + s, a.layout, g);
    }
  }
}

ActBatch act_dispatch_batch_ref(const uint16_t* x, int64_t T, int64_t K, const int32_t* topk_ids, int topk,
                                int num_experts, int capacity, bool quantize, format::ActLayout layout) {
  MOESQ_CHECK(num_experts > 0 && capacity >= 0 && topk > 0, "dispatch_ref: bad sizes E=", num_experts,
              " capacity=", capacity, " topk=", topk);
  ActBatch b = empty_act_batch(num_experts, capacity, K, layout);
  DispatchArgs a;
  a.x = x, a.topk_ids = topk_ids, a.T = T, a.topk = topk, a.K = K, a.K_pad = b.K_pad;
  a.num_experts = num_experts, a.capacity = capacity, a.quantize = quantize, a.layout = layout;
  a.out = b.x.data(), a.inv_scale = b.inv_scale.data(), a.counts = b.counts.data();
  a.route_of_slot = b.route_of_slot.data();
  act_dispatch_ref(a);
  return b;
}

}  // namespace moesq::ops
