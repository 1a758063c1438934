// The activation row quantizer and empty batch of the MoE `_ref` twins (act_batch.h).
//
// Non-obvious decision: the activation quantizer calls the format module's own codecs and
// nvfp4_tensor_scale in the same fp32 order as format::quantize_activation_row (block code
// UE4M3((γ·amax_b)/6), multiplier γ/s, value E2M1(x·(γ/s))), so "GPU == ref" also means
// "GPU == the quantizer the compression pipeline evaluated".
#include "ops/common/act_batch.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "format/fp_codecs.h"

namespace moesq::ops {

namespace {
float value_of(const uint16_t* x, int64_t k) { return bf16_to_f32(x[k]); }
float value_of(const float* x, int64_t k) { return x[k]; }

template <typename Row>
void quant_row(const Row* x, int64_t K, uint16_t* out, float* inv_scale, format::ActLayout layout,
               float static_gamma) {
  const int64_t K_pad = format::padded_k(K);
  std::fill(out, out + K_pad, uint16_t{0});
  float amax = 0.0f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(value_of(x, k)));
  const float gamma = static_gamma > 0.0f ? static_gamma : format::nvfp4_tensor_scale(amax);
  constexpr int B = format::kActScaleBlock;
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    float bmax = 0.0f;
    for (int j = 0; j < B; ++j) bmax = std::max(bmax, std::fabs(value_of(x, b0 + j)));
    const uint8_t code = format::ue4m3_encode(gamma * bmax / format::kE2M1Max);
    const float s = format::e4m3_decode(code);
    const float mult = s > 0.0f ? gamma / s : 0.0f;
    for (int j = 0; j < B; ++j) {
      const uint8_t q = s > 0.0f ? format::e2m1_encode(value_of(x, b0 + j) * mult) : uint8_t{0};
      out[format::act_storage_index(b0 + j, layout)] = f32_to_bf16(format::e2m1_decode(q) * s);  // exact in bf16
    }
  }
  *inv_scale = 1.0f / gamma;
}
}  // namespace

void act_quant_row_ref(const uint16_t* x, int64_t K, bool quantize, uint16_t* out, float* inv_scale,
                       format::ActLayout layout, float static_gamma) {
  MOESQ_CHECK(K > 0 && K % format::kActScaleBlock == 0, "act_quant_row_ref: K=", K, " is not a multiple of ",
              format::kActScaleBlock);
  if (!quantize) {
    std::fill(out, out + format::padded_k(K), uint16_t{0});
    for (int64_t k = 0; k < K; ++k) out[format::act_storage_index(k, layout)] = x[k];
    *inv_scale = 1.0f;
    return;
  }
  quant_row(x, K, out, inv_scale, layout, static_gamma);
}

void act_quant_row_f32_ref(const float* x, int64_t K, uint16_t* out, float* inv_scale, format::ActLayout layout,
                           float static_gamma) {
  MOESQ_CHECK(K > 0 && K % format::kActScaleBlock == 0, "act_quant_row_f32_ref: K=", K, " is not a multiple of ",
              format::kActScaleBlock);
  quant_row(x, K, out, inv_scale, layout, static_gamma);
}

ActBatch empty_act_batch(int num_experts, int capacity, int64_t K, format::ActLayout layout) {
  ActBatch a;
  a.num_experts = num_experts;
  a.capacity = capacity;
  a.K = K;
  a.K_pad = format::padded_k(K);
  a.layout = layout;
  a.x.assign(static_cast<size_t>(num_experts) * capacity * a.K_pad, 0);
  a.inv_scale.assign(static_cast<size_t>(num_experts) * capacity, 1.0f);
  a.counts.assign(num_experts, 0);
  a.route_of_slot.assign(static_cast<size_t>(num_experts) * capacity, -1);
  return a;
}

}  // namespace moesq::ops
