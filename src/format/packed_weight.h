// One packed NVFP4 weight W [N, K] in either format moesq writes: paired 4:8 NVFP4 (Sparse48Tensor,
// 2.75 bits/weight) or dense NVFP4 (Nvfp4Tensor, 4.5 bits/weight). A small traits surface over a
// std::variant, so callers never carry a tensor of each kind plus a bool saying which one is live.
#pragma once
#include <cstdint>
#include <variant>
#include <vector>

#include "format/nvfp4.h"

namespace moesq::format {

class PackedWeight {
 public:
  PackedWeight() = default;
  PackedWeight(Sparse48Tensor t) : t_(std::move(t)) {}  // NOLINT: implicit, like the variant
  PackedWeight(Nvfp4Tensor t) : t_(std::move(t)) {}     // NOLINT

  bool is_sparse48() const { return std::holds_alternative<Sparse48Tensor>(t_); }
  const Sparse48Tensor* sparse48() const { return std::get_if<Sparse48Tensor>(&t_); }  // null if dense
  const Nvfp4Tensor* nvfp4() const { return std::get_if<Nvfp4Tensor>(&t_); }          // null if 4:8

  int64_t N() const { return std::visit([](const auto& t) { return t.N; }, t_); }
  int64_t K() const { return std::visit([](const auto& t) { return t.K; }, t_); }
  float global_scale() const { return std::visit([](const auto& t) { return t.global_scale; }, t_); }
  size_t packed_bytes() const { return std::visit([](const auto& t) { return t.packed_bytes(); }, t_); }
  void dequantize(float* out) const;   // out: [N, K] fp32
  std::vector<float> dequantize() const;

 private:
  std::variant<Sparse48Tensor, Nvfp4Tensor> t_;
};

}  // namespace moesq::format
