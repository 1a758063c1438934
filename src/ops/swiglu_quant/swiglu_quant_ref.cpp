// CPU twin of swiglu_quant (swiglu_quant.h) on the launcher's descriptor: silu(gate)·up in fp32, rounded
// to bf16 (kept fp32 from h_f32 with quantize), then the row quantizer; and the checks both sides share.
#include "ops/swiglu_quant/swiglu_quant.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "core/swiglu.h"
#include "format/nvfp4.h"

namespace moesq::ops {

void swiglu_quant_check(const SwigluQuantArgs& a) {
  MOESQ_CHECK(a.I > 0 && a.I % format::kActScaleBlock == 0 && a.I_pad >= a.I && a.I_pad % 256 == 0,
              "swiglu_quant: I=", a.I, " I_pad=", a.I_pad, " (I must be a multiple of 32, I_pad of 256)");
  MOESQ_CHECK(a.num_experts > 0 && a.num_experts <= 65535 && a.capacity >= 0, "swiglu_quant: bad sizes E=",
              a.num_experts, " capacity=", a.capacity);
  MOESQ_CHECK(a.layout == format::ActLayout::kMmaFragment || a.layout == format::ActLayout::kKMajor,
              "swiglu_quant: unknown ActLayout ", static_cast<int>(a.layout));
  if (a.capacity == 0) return;
  MOESQ_CHECK((a.h != nullptr) != (a.h_f32 != nullptr), "swiglu_quant: give exactly one of h, h_f32");
  if (a.slot_of_route)
    MOESQ_CHECK(a.topk_ids && a.routes >= 0 && a.routes <= 0x7fffffff, "swiglu_quant: route grid needs topk_ids and ",
                "0 <= routes < 2^31 (routes=", a.routes, ")");
}

namespace {

// One slot s = e·capacity + slot: the SwiGLU row, then the quantizer. row: [I] bf16, row_f32: [I] fp32 scratch.
void swiglu_slot(const SwigluQuantArgs& a, int64_t s, std::vector<uint16_t>& row, std::vector<float>& row_f32) {
  const bool f32_row = a.h_f32 && a.quantize;
  const int64_t e_row = s / a.capacity;
  const float* bias = a.gate_up_bias ? a.gate_up_bias + e_row * 2 * a.I : nullptr;
  for (int64_t i = 0; i < a.I; ++i) {
    float g = a.h_f32 ? a.h_f32[s * 2 * a.I + i] : bf16_to_f32(a.h[s * 2 * a.I + i]);
    float u = a.h_f32 ? a.h_f32[s * 2 * a.I + a.I + i] : bf16_to_f32(a.h[s * 2 * a.I + a.I + i]);
    if (bias) g += bias[i], u += bias[a.I + i];
    const float y = a.clamped ? clamped_swiglu(g, u, a.alpha, a.limit) : g / (1.0f + std::exp(-g)) * u;
    if (f32_row) row_f32[i] = y;
    else row[i] = f32_to_bf16(y);
  }
  uint16_t* out = a.out + s * a.I_pad;  // [I_pad]
  std::fill(out, out + a.I_pad, uint16_t{0});
  const int e = static_cast<int>(s / a.capacity);
  const float g = a.act_gamma ? a.act_gamma[e] : 0.0f;
  MOESQ_CHECK(!a.act_gamma || !a.quantize || (std::isfinite(g) && g > 0.0f), "swiglu_quant_ref: act_gamma[", e,
              "]=", g, " is not a finite positive static scale");
  if (f32_row) act_quant_row_f32_ref(row_f32.data(), a.I, out, a.inv_scale + s, a.layout, g);
  else act_quant_row_ref(row.data(), a.I, a.quantize, out, a.inv_scale + s, a.layout, g);
}

}  // namespace

void swiglu_quant_ref(const SwigluQuantArgs& a) {
  swiglu_quant_check(a);
  if (a.capacity == 0) return;
  std::vector<uint16_t> row(a.I);
  std::vector<float> row_f32(a.I);
  const auto filled = [&](int e, int slot) { return slot >= 0 && slot < std::min(a.counts[e], a.capacity); };
  if (a.slot_of_route) {  // the route grid: the slots the valid routes name
    for (int64_t r = 0; r < a.routes; ++r) {
      const int e = a.topk_ids[r], slot = a.slot_of_route[r];
      if (e < 0 || e >= a.num_experts || e < a.expert_begin || (a.expert_end >= 0 && e >= a.expert_end)) continue;
      if (!filled(e, slot)) continue;
      swiglu_slot(a, static_cast<int64_t>(e) * a.capacity + slot, row, row_f32);
    }
    return;
  }
  for (int e = 0; e < a.num_experts; ++e)
    for (int slot = 0; filled(e, slot); ++slot) swiglu_slot(a, static_cast<int64_t>(e) * a.capacity + slot, row, row_f32);
}

ActBatch swiglu_quant_batch_ref(const std::vector<uint16_t>& h, int num_experts, int capacity, int64_t I,
                                const std::vector<int32_t>& counts, bool quantize, format::ActLayout layout) {
  MOESQ_CHECK(h.size() == static_cast<size_t>(num_experts) * capacity * 2 * I, "swiglu_quant_ref: h has ", h.size(),
              " elements, expected [", num_experts, ", ", capacity, ", ", 2 * I, "]");
  ActBatch b = empty_act_batch(num_experts, capacity, I, layout);
  b.counts = counts;
  SwigluQuantArgs a;
  a.h = h.data(), a.counts = b.counts.data(), a.num_experts = num_experts, a.capacity = capacity;
  a.I = I, a.I_pad = b.K_pad, a.quantize = quantize, a.layout = layout;
  a.out = b.x.data(), a.inv_scale = b.inv_scale.data();
  swiglu_quant_ref(a);
  return b;
}

}  // namespace moesq::ops
