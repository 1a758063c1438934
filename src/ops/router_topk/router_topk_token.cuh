// Device function of the routing (router_topk.h): one token's scores and top-k by one warp. The
// router_topk kernel runs it one warp per token; the small-M bf16 GEMM's last CTA runs it on the router
// logits it has just written (GemmBf16Args::fused_topk, gemm_bf16_small_m.cu) — the same code, so the
// same ids and weight bits either way.
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "ops/router_topk/router_topk.h"

namespace moesq::ops::detail {

constexpr int kRouterTopkMaxExperts = 512;

// Sigmoid scoring (router_topk.h): p = σ(z), c = p + bias, grouped masking of c; the twin's order.
__device__ inline void sigmoid_choice(const RouterTopkArgs& a, const float* z, float* p, float* c, int lane) {
  const int E = a.num_experts, G = a.n_group, per = E / G;
  for (int e = lane; e < E; e += 32) {
    const float pe = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z[e])));
    p[e] = pe;
    c[e] = a.correction_bias ? __fadd_rn(pe, a.correction_bias[e]) : pe;
  }
  __syncwarp();
  if (G <= 1) return;
  float gs = -INFINITY;  // lane g < G: its group's score, the sum of its two best c
  if (lane < G) {
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int e = lane * per; e < (lane + 1) * per; ++e) {
      const float v = c[e];
      if (v > b1) {
        b2 = b1, b1 = v;
      } else if (v > b2) {
        b2 = v;
      }
    }
    gs = per >= 2 ? __fadd_rn(b1, b2) : b1;
  }
  bool keep = false;
  for (int i = 0; i < a.topk_group; ++i) {  // the best group not yet kept, ties → lower group
    float bv = lane < G && !keep ? gs : -INFINITY;
    int bi = lane < G && !keep ? lane : 32;
    for (int x = 16; x > 0; x /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, x);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, x);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (lane == bi) keep = true;
  }
  const unsigned kept = __ballot_sync(0xffffffffu, keep);
  for (int e = lane; e < E; e += 32)
    if (!((kept >> (e / per)) & 1u)) c[e] = 0.0f;
  __syncwarp();
}

// Token t's routes into a.topk_ids / a.topk_w, by the calling warp (all 32 lanes). p, c: the warp's
// [kRouterTopkMaxExperts] fp32 shared-memory scratch (c: the sigmoid choice scores). The logits are
// read past L1 (__ldcg): in the fused GEMM other CTAs of the same kernel wrote them.
__device__ inline void router_topk_token(const RouterTopkArgs& a, int64_t t, float* p, float* c, int lane) {
  const int E = a.num_experts;
  // z (+ bias) into p first, read past L1; every lane then reads and overwrites only its own
  // entries e ≡ lane (mod 32) until the next __syncwarp, so scoring in place is safe. topk_softmax takes
  // its choices from these values.
  const float* zg = a.logits + t * E;
  for (int e = lane; e < E; e += 32) {
    const float v = __ldcg(zg + e);
    p[e] = a.logit_bias ? __fadd_rn(v, a.logit_bias[e]) : v;
  }
  __syncwarp();
  const float* z = p;
  if (a.topk_softmax) {
    // p holds z (+ bias): the top-k is taken from it, the weights follow (exp(z_j − z_first) / Σ)
  } else if (a.sigmoid) {
    sigmoid_choice(a, z, p, c, lane);
  } else {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, z[e]);
    for (int x = 16; x > 0; x /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    float s = 0.0f;
    for (int e = lane; e < E; e += 32) s = __fadd_rn(s, p[e] = expf(__fsub_rn(z[e], mx)));
    for (int h = 1; h < 32; h *= 2) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, h));
    for (int e = lane; e < E; e += 32) p[e] = __fdiv_rn(p[e], s);
    __syncwarp();
  }
  float* score = a.sigmoid ? c : p;
  float wsum = 0.0f, w_mine = 0.0f, z_first = 0.0f;
  for (int j = 0; j < a.topk; ++j) {
    float bv = -INFINITY;
    int bi = E;
    for (int e = lane; e < E; e += 32)
      if (score[e] > bv) bv = score[e], bi = e;  // ascending e per lane: first max = lowest id
    for (int x = 16; x > 0; x /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, x);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, x);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (j == 0) z_first = bv;
    // sigmoid: the weight is p, whatever chose it; top-k-softmax: exp(z_j − z_first), normalized below
    const float w = a.topk_softmax ? expf(__fsub_rn(bv, z_first)) : a.sigmoid ? p[bi] : bv;
    wsum = __fadd_rn(wsum, w);
    if (lane == j) w_mine = w;
    if (lane == 0) a.topk_ids[t * a.topk + j] = bi;
    __syncwarp();
    if (lane == 0) score[bi] = -INFINITY;  // taken
    __syncwarp();
  }
  if (a.topk_softmax) {  // the softmax over the k: normalized whatever norm_topk_prob, never scaled
    if (lane < a.topk) a.topk_w[t * a.topk + lane] = __fdiv_rn(w_mine, wsum);
    return;
  }
  if (a.sigmoid) wsum = __fadd_rn(wsum, 1e-20f);
  if (lane < a.topk) {
    float w = a.norm_topk_prob ? __fdiv_rn(w_mine, wsum) : w_mine;
    if (a.routed_scaling_factor != 1.0f) w = __fmul_rn(w, a.routed_scaling_factor);
    a.topk_w[t * a.topk + lane] = w;
  }
}

}  // namespace moesq::ops::detail
