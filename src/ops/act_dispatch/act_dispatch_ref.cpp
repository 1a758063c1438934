// CPU twin of act_dispatch (act_dispatch.h): routes → per-expert batches in the canonical slot order.
#include "ops/act_dispatch/act_dispatch.h"

#include "core/error.h"

namespace moesq::ops {

ActBatch dispatch_ref(const uint16_t* x, int64_t T, int64_t K, const int32_t* topk_ids, int topk, int num_experts,
                      int capacity, bool quantize, format::ActLayout layout) {
  MOESQ_CHECK(num_experts > 0 && capacity >= 0 && topk > 0, "dispatch_ref: bad sizes E=", num_experts,
              " capacity=", capacity, " topk=", topk);
  ActBatch a = empty_act_batch(num_experts, capacity, K, layout);
  for (int64_t r = 0; r < T * topk; ++r) {
    const int e = topk_ids[r];
    MOESQ_CHECK(e >= 0 && e < num_experts, "dispatch_ref: topk_ids[", r, "]=", e, " not in [0, ", num_experts, ")");
    const int slot = a.counts[e]++;
    if (slot >= capacity) continue;
    const size_t s = static_cast<size_t>(e) * capacity + slot;
    a.route_of_slot[s] = static_cast<int32_t>(r);
    act_quant_row_ref(x + (r / topk) * K, K, quantize, a.x.data() + s * a.K_pad, &a.inv_scale[s], layout);
  }
  return a;
}

}  // namespace moesq::ops
