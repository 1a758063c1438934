// Shapes and scratch of one MoE block call (moe_workspace.h).
#include "runtime/layers/moe_workspace.h"

#include <algorithm>

#include "format/kernel_layout.h"
#include "ops/gemm_bf16/gemm_bf16.h"

namespace moesq::runtime {

MoeBlockDims moe_block_dims(const io::ModelSpec& s) {
  MoeBlockDims d;
  d.H = s.hidden_size, d.I = s.moe_intermediate_size, d.E = s.num_experts, d.top_k = s.top_k;
  d.H_pad = format::padded_k(d.H), d.I_pad = format::padded_k(d.I);
  d.norm_topk_prob = s.norm_topk_prob;
  d.sigmoid_router = s.router_scoring == io::RouterScoring::Sigmoid;
  d.correction_bias = s.router_correction_bias;
  d.n_group = static_cast<int>(s.n_group), d.topk_group = static_cast<int>(s.topk_group);
  d.routed_scaling_factor = static_cast<float>(s.routed_scaling_factor);
  d.topk_softmax = s.router_scoring == io::RouterScoring::TopkSoftmax, d.router_logit_bias = s.router_logit_bias;
  d.expert_bias = s.expert_bias, d.clamped_swiglu = s.clamped_swiglu;
  d.swiglu_alpha = static_cast<float>(s.swiglu_alpha), d.swiglu_limit = static_cast<float>(s.swiglu_limit);
  if (s.num_shared_experts > 0) d.mlp_I = s.shared_expert_intermediate_size, d.shared_gated = s.shared_expert_gate;
  for (int64_t l = 0; l < s.num_layers; ++l)
    if (!s.is_moe_layer(l)) d.mlp_I = std::max(d.mlp_I, s.intermediate_size);
  d.expert_begin = 0, d.expert_end = d.E;
  return d;
}

namespace {

// Carves 256-byte aligned pieces out of one block: a pass over base nullptr measures the bytes.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<unsigned char*>(base)) {}
  template <class T>
  void take(T*& p, size_t count) {
    p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += (sizeof(T) * std::max<size_t>(count, 1) + 255) / 256 * 256;
  }
  size_t used() const { return used_; }

 private:
  unsigned char* base_;
  size_t used_ = 0;
};

void carve(Carver& c, const MoeBlockDims& d, int64_t T, MoeBlockBuffers& b) {
  const size_t E = d.E, k = d.top_k, Tn = T;
  c.take(b.router_logits, Tn * E);
  c.take(b.gemm_split, ops::gemm_bf16_split_floats(T, d.E, d.H));
  c.take(b.topk_ids, Tn * k);
  c.take(b.topk_w, Tn * k);
  c.take(b.slot_of_route, Tn * k);
  c.take(b.xd, E * Tn * d.H_pad);
  c.take(b.hbuf, E * Tn * 2 * d.I);
  c.take(b.ad, E * Tn * d.I_pad);
  c.take(b.ybuf, E * Tn * d.H);
  c.take(b.xs, E * Tn);
  c.take(b.as, E * Tn);
  c.take(b.counts, E);
  c.take(b.route_of_slot, E * Tn);
  if (d.mlp_I > 0) {
    const size_t Im = d.mlp_I;
    c.take(b.mlp_gu, Tn * (2 * Im + 1));
    c.take(b.mlp_a, Tn * Im);
    c.take(b.mlp_a_lo, Tn * Im);
  }
  if (d.sharded()) c.take(b.routes, Tn * k * d.H);
}

}  // namespace

size_t moe_workspace_bytes(const MoeBlockDims& d, int64_t T) {
  Carver c(nullptr);
  MoeBlockBuffers b;
  carve(c, d, T, b);
  return c.used();
}

MoeBlockBuffers carve_moe_workspace(void* base, const MoeBlockDims& d, int64_t T) {
  Carver c(base);
  MoeBlockBuffers b;
  carve(c, d, T, b);
  return b;
}

}  // namespace moesq::runtime
