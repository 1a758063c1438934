// The launch descriptors every expert backend's stage shares (expert_backend.h ExpertStage): the
// dispatch of routes into per-expert batches of capacity T, and the SwiGLU (+ requant) over the route
// grid (T·k CTAs, not E × capacity). A backend sets the rest (quantize, layout, x_lo).
#pragma once
#include "ops/act_dispatch/act_dispatch.h"
#include "ops/swiglu_quant/swiglu_quant.h"
#include "runtime/experts/expert_backend.h"

namespace moesq::runtime {

inline ops::DispatchArgs stage_dispatch_args(const ExpertStage& s) {
  const MoeBlockDims& dm = *s.dims;
  const MoeBlockBuffers& b = *s.buffers;
  ops::DispatchArgs d;
  d.x = s.x, d.topk_ids = b.topk_ids, d.T = s.T, d.topk = static_cast<int>(dm.top_k), d.K = dm.H, d.K_pad = dm.H_pad;
  d.num_experts = static_cast<int>(dm.E), d.capacity = static_cast<int>(s.T), d.out = b.xd, d.inv_scale = b.xs;
  d.counts = b.counts, d.route_of_slot = b.route_of_slot, d.slot_of_route = b.slot_of_route;
  d.counts_zeroed = s.counts_zeroed;
  return d;
}

inline ops::SwigluQuantArgs stage_swiglu_args(const ExpertStage& s) {
  const MoeBlockDims& dm = *s.dims;
  const MoeBlockBuffers& b = *s.buffers;
  ops::SwigluQuantArgs sw;
  sw.h_f32 = b.hbuf, sw.counts = b.counts, sw.num_experts = static_cast<int>(dm.E), sw.capacity = static_cast<int>(s.T);
  sw.I = dm.I, sw.I_pad = dm.I_pad, sw.out = b.ad, sw.inv_scale = b.as;
  sw.topk_ids = b.topk_ids, sw.slot_of_route = b.slot_of_route, sw.routes = s.T * dm.top_k;
  sw.expert_begin = dm.expert_begin, sw.expert_end = dm.expert_end;  // the shard's routes only
  sw.gate_up_bias = s.gate_up_bias;
  sw.clamped = dm.clamped_swiglu, sw.alpha = dm.swiglu_alpha, sw.limit = dm.swiglu_limit;
  return sw;
}

}  // namespace moesq::runtime
