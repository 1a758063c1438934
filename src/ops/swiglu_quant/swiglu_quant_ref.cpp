// CPU twin of swiglu_quant (swiglu_quant.h): silu(gate)·up in fp32, rounded to bf16, then the row quantizer.
#include "ops/swiglu_quant/swiglu_quant.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"

namespace moesq::ops {

ActBatch swiglu_quant_ref(const std::vector<uint16_t>& h, int num_experts, int capacity, int64_t I,
                          const std::vector<int32_t>& counts, bool quantize, format::ActLayout layout) {
  MOESQ_CHECK(h.size() == static_cast<size_t>(num_experts) * capacity * 2 * I, "swiglu_quant_ref: h has ", h.size(),
              " elements, expected [", num_experts, ", ", capacity, ", ", 2 * I, "]");
  ActBatch a = empty_act_batch(num_experts, capacity, I, layout);
  a.counts = counts;
  std::vector<uint16_t> row(I);
  for (int e = 0; e < num_experts; ++e) {
    const int n = std::min(counts[e], capacity);
    for (int slot = 0; slot < n; ++slot) {
      const size_t s = static_cast<size_t>(e) * capacity + slot;
      const uint16_t* hr = h.data() + s * 2 * I;
      for (int64_t i = 0; i < I; ++i) {
        const float g = bf16_to_f32(hr[i]), u = bf16_to_f32(hr[I + i]);
        row[i] = f32_to_bf16(g / (1.0f + std::exp(-g)) * u);
      }
      act_quant_row_ref(row.data(), I, quantize, a.x.data() + s * a.K_pad, &a.inv_scale[s], layout);
    }
  }
  return a;
}

}  // namespace moesq::ops
