// CPU reference twins of the MoE expert kernels (sparse_gemm_ref.h).
//
// Non-obvious decision: the activation quantizer calls the format module's own codecs and
// nvfp4_tensor_scale in the same fp32 order as format::quantize_activation_row (block code
// UE4M3((γ·amax_b)/6), multiplier γ/s, value E2M1(x·(γ/s))), so "GPU == ref" also means
// "GPU == the quantizer the compression pipeline evaluated".
#include "ops/common/act_batch.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "core/threads.h"
#include "format/fp_codecs.h"

namespace moesq::moe {

namespace {
inline uint8_t nibble_at(const uint8_t* bytes, int64_t idx) { return (bytes[idx >> 1] >> ((idx & 1) * 4)) & 0xf; }
}  // namespace

void act_quant_row_ref(const uint16_t* x, int64_t K, bool quantize, uint16_t* out, float* inv_scale,
                       ActLayout layout) {
  MOESQ_CHECK(K > 0 && K % format::kActScaleBlock == 0, "act_quant_row_ref: K=", K, " is not a multiple of ",
              format::kActScaleBlock);
  const int64_t K_pad = padded_k(K);
  std::fill(out, out + K_pad, uint16_t{0});
  if (!quantize) {
    for (int64_t k = 0; k < K; ++k) out[act_storage_index(k, layout)] = x[k];
    *inv_scale = 1.0f;
    return;
  }
  float amax = 0.0f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(bf16_to_f32(x[k])));
  const float gamma = format::nvfp4_tensor_scale(amax);
  constexpr int B = format::kActScaleBlock;
  for (int64_t b0 = 0; b0 < K; b0 += B) {
    float bmax = 0.0f;
    for (int j = 0; j < B; ++j) bmax = std::max(bmax, std::fabs(bf16_to_f32(x[b0 + j])));
    const uint8_t code = format::ue4m3_encode(gamma * bmax / format::kE2M1Max);
    const float s = format::e4m3_decode(code);
    const float mult = s > 0.0f ? gamma / s : 0.0f;
    for (int j = 0; j < B; ++j) {
      const uint8_t q = s > 0.0f ? format::e2m1_encode(bf16_to_f32(x[b0 + j]) * mult) : uint8_t{0};
      out[act_storage_index(b0 + j, layout)] = f32_to_bf16(format::e2m1_decode(q) * s);  // exact in bf16
    }
  }
  *inv_scale = 1.0f / gamma;
}

namespace {

// An all-empty batch of E experts × capacity slots for rows of K values in `layout`: x zero,
// 1/γ_a = 1, counts 0, no routes.
ActBatch empty_batch(int num_experts, int capacity, int64_t K, ActLayout layout) {
  ActBatch a;
  a.num_experts = num_experts;
  a.capacity = capacity;
  a.K = K;
  a.K_pad = padded_k(K);
  a.layout = layout;
  a.x.assign(static_cast<size_t>(num_experts) * capacity * a.K_pad, 0);
  a.inv_scale.assign(static_cast<size_t>(num_experts) * capacity, 1.0f);
  a.counts.assign(num_experts, 0);
  a.route_of_slot.assign(static_cast<size_t>(num_experts) * capacity, -1);
  return a;
}

}  // namespace

ActBatch dispatch_ref(const uint16_t* x, int64_t T, int64_t K, const int32_t* topk_ids, int topk, int num_experts,
                      int capacity, bool quantize, ActLayout layout) {
  MOESQ_CHECK(num_experts > 0 && capacity >= 0 && topk > 0, "dispatch_ref: bad sizes E=", num_experts,
              " capacity=", capacity, " topk=", topk);
  ActBatch a = empty_batch(num_experts, capacity, K, layout);
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

void sparse48_decode_unscaled(const format::Sparse48Tensor& t, float* out) {
  std::memset(out, 0, sizeof(float) * t.N * t.K);
  for (int64_t n = 0; n < t.N; ++n) {
    for (int64_t g = 0; g < t.K / 8; ++g) {
      const uint8_t nib = nibble_at(t.meta.data(), n * (t.K / 8) + g);
      const int pos[4] = {2 * (nib & 3), 2 * (nib & 3) + 1, 2 * (nib >> 2), 2 * (nib >> 2) + 1};
      const float s = format::e4m3_decode(t.scales[n * (t.K / 32) + g / 4]);
      for (int j = 0; j < 4; ++j) {
        const uint8_t q = nibble_at(t.values.data(), n * (t.K / 2) + g * 4 + j);
        out[n * t.K + g * 8 + pos[j]] = format::e2m1_decode(q) * s;
      }
    }
  }
}

void grouped_sparse_gemm_ref(const std::vector<const format::Sparse48Tensor*>& experts, const ActBatch& act,
                             float* y) {
  MOESQ_CHECK(static_cast<int>(experts.size()) == act.num_experts, "grouped_sparse_gemm_ref: ", experts.size(),
              " experts but the batch has ", act.num_experts);
  const int64_t M = experts.empty() ? 0 : experts[0]->N;
  for (int e = 0; e < act.num_experts; ++e) {
    const auto& t = *experts[e];
    MOESQ_CHECK(t.N == M && t.K == act.K, "grouped_sparse_gemm_ref: expert ", e, " is [", t.N, ", ", t.K,
                "], expected [", M, ", ", act.K, "]");
    std::vector<float> w(static_cast<size_t>(M * t.K));
    sparse48_decode_unscaled(t, w.data());
    const int n = std::min(act.counts[e], act.capacity);
    const float inv_w = 1.0f / t.global_scale;
    parallel_for(n, [&](int64_t slot) {
      const size_t s = static_cast<size_t>(e) * act.capacity + slot;
      std::vector<double> xv(t.K);
      for (int64_t k = 0; k < t.K; ++k) xv[k] = bf16_to_f32(act.x[s * act.K_pad + act_storage_index(k, act.layout)]);
      const float alpha = inv_w * act.inv_scale[s];
      for (int64_t m = 0; m < M; ++m) {
        double acc = 0.0;
        const float* wr = w.data() + m * t.K;
        for (int64_t k = 0; k < t.K; ++k) acc += static_cast<double>(wr[k]) * xv[k];
        y[s * M + m] = static_cast<float>(acc) * alpha;
      }
    });
  }
}

ActBatch swiglu_quant_ref(const std::vector<uint16_t>& h, int num_experts, int capacity, int64_t I,
                          const std::vector<int32_t>& counts, bool quantize, ActLayout layout) {
  MOESQ_CHECK(h.size() == static_cast<size_t>(num_experts) * capacity * 2 * I, "swiglu_quant_ref: h has ", h.size(),
              " elements, expected [", num_experts, ", ", capacity, ", ", 2 * I, "]");
  ActBatch a = empty_batch(num_experts, capacity, I, layout);
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

}  // namespace moesq::moe
