// The per-row code of one SGPTQ column block (sgptq_columns.h), written once for the host (the
// `_ref` twin) and the device (the kernel). Every fp64 product feeding a sum is rounded on its own
// (the dmul/dadd helpers: no fused multiply-add on the device), so both sides give the same bits.
// The E2M1/UE4M3 codecs are format/fp_codecs.h on the host and ops/common/nvfp4_row.cuh on the
// device (bit-identical, tested there).
#pragma once
#include <cstdint>

#include "ops/sgptq_columns/sgptq_columns.h"

#if defined(__CUDACC__)
#include "ops/common/nvfp4_row.cuh"
#define MOESQ_SGPTQ_HD __host__ __device__ __forceinline__
#else
#include <cmath>
#define MOESQ_SGPTQ_HD inline
#endif
#include "format/fp_codecs.h"

namespace moesq::ops::sgptq_detail {

constexpr int kGroup = 8, kScaleBlock = 32, kPairs = 4, kPatterns = 6;

// Pair i (0, 1) of pattern p (format::kPatternPairs).
MOESQ_SGPTQ_HD constexpr int pattern_pair(int p, int i) {
  switch (p) {
    case 0: return i == 0 ? 0 : 1;
    case 1: return i == 0 ? 0 : 2;
    case 2: return i == 0 ? 0 : 3;
    case 3: return i == 0 ? 1 : 2;
    case 4: return i == 0 ? 1 : 3;
    default: return i == 0 ? 2 : 3;
  }
}

// Slot (0..3) of in-group offset o among the kept values of pattern p, or −1 when pruned.
MOESQ_SGPTQ_HD int kept_slot(int p, int o) {
  const int pair = o / 2;
  if (pair == pattern_pair(p, 0)) return o % 2;
  if (pair == pattern_pair(p, 1)) return 2 + o % 2;
  return -1;
}

MOESQ_SGPTQ_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MOESQ_SGPTQ_HD double dadd(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

MOESQ_SGPTQ_HD uint8_t ue4m3_encode(float v) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint8_t>(detail::ue4m3_encode(v));
#else
  return format::ue4m3_encode(v);
#endif
}
MOESQ_SGPTQ_HD float ue4m3_decode(uint8_t c) {
#if defined(__CUDA_ARCH__)
  return detail::ue4m3_decode(c);
#else
  return format::e4m3_decode(c);
#endif
}
MOESQ_SGPTQ_HD uint8_t e2m1_encode(float x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint8_t>(detail::e2m1_encode(x));
#else
  return format::e2m1_encode(x);
#endif
}
MOESQ_SGPTQ_HD float e2m1_decode(uint8_t c) {
#if defined(__CUDA_ARCH__)
  return detail::e2m1_decode(c);
#else
  return format::e2m1_decode(c);
#endif
}

// Where one row's block lives: weight of column j at w[(j − c0)·ldw], U_ij at u[(i − c0)·ldu + (j − c0)],
// for the columns j, i of the block being solved (global memory in the twin, shared memory in the kernel).
struct RowBlock {
  double* w;
  int64_t ldw;
  const double* u;
  int64_t ldu;
  int64_t c0;
  MOESQ_SGPTQ_HD double& W(int64_t j) const { return w[(j - c0) * ldw]; }
  MOESQ_SGPTQ_HD double U(int64_t i, int64_t j) const { return u[(i - c0) * ldu + (j - c0)]; }
};

// SparseGPT's choice for the group at column g0: the 2 pairs with the largest Σ w²/d².
MOESQ_SGPTQ_HD uint8_t choose_pattern(const RowBlock& b, int64_t g0) {
  double score[kPairs];
  for (int p = 0; p < kPairs; ++p) {
    double s = 0.0;
    for (int e = 0; e < 2; ++e) {
      const int64_t j = g0 + 2 * p + e;
      const double w = b.W(j), d = b.U(j, j);
      s = dadd(s, dmul(w, w) / dmul(d, d));
    }
    score[p] = s;
  }
  int best = 0;
  double best_score = -1.0;
  for (int pt = 0; pt < kPatterns; ++pt) {
    const double s = dadd(score[pattern_pair(pt, 0)], score[pattern_pair(pt, 1)]);
    if (s > best_score) {
      best_score = s;
      best = pt;
    }
  }
  return static_cast<uint8_t>(best);
}

// Row r over columns [b0, b1) (see sgptq_columns.h), its block in b. Returns false when an e is not finite.
MOESQ_SGPTQ_HD bool sgptq_row(const SgptqColumnsArgs& a, int64_t r, const RowBlock& b) {
  const int64_t N = a.N, K = a.K, G = K / kGroup, S = K / kScaleBlock;
  uint8_t* rp = a.patterns + r * G;
  float s = 0.0f;  // decoded UE4M3 code of the current scale block
  double loss = a.row_loss[r];
  bool finite = true;
  for (int64_t i = a.b0; i < a.b1; ++i) {
    if (i % kScaleBlock == 0) {
      if (a.choose)
        for (int g = 0; g < kScaleBlock / kGroup; ++g) rp[i / kGroup + g] = choose_pattern(b, i + g * kGroup);
      float amax = 0.0f;
      for (int64_t j = i; j < i + kScaleBlock; ++j) {
        if (kept_slot(rp[j / kGroup], static_cast<int>(j % kGroup)) < 0) continue;
        const float v = fabsf(static_cast<float>(b.W(j)));
        amax = v > amax ? v : amax;  // std::max(amax, v) for finite values
      }
      const uint8_t c = ue4m3_encode(a.gamma * amax / 6.0f);
      a.scale_codes[r * S + i / kScaleBlock] = c;
      s = ue4m3_decode(c);
    } else if (a.choose && a.pattern_at_group && i % kGroup == 0) {
      rp[i / kGroup] = choose_pattern(b, i);
    }
    const int slot = kept_slot(rp[i / kGroup], static_cast<int>(i % kGroup));
    const double w = b.W(i);
    double q = 0.0;
    if (slot >= 0) {
      uint8_t code = 0;
      float qf = 0.0f;
      if (s > 0.0f) {
        code = e2m1_encode(static_cast<float>(w) * (a.gamma / s));
        qf = e2m1_decode(code) * s / a.gamma;
      }
      a.value_codes[r * (K / 2) + (i / kGroup) * kPairs + slot] = code;
      q = qf;
      a.dense_rounded[r * K + i] = qf;
      if (a.dequant) a.dequant[r * K + i] = qf;
    } else {
      a.dense_rounded[r * K + i] = static_cast<float>(w);
      if (a.dequant) a.dequant[r * K + i] = 0.0f;
    }
    double e = (w - q) / b.U(i, i);
    loss = dadd(loss, dmul(dmul(0.5, e), e));
    finite = finite && (e - e == 0.0);
    if (i < a.gptq_from) e = 0.0;
    a.err[(i - a.b0) * N + r] = e;
    for (int64_t j = i + 1; j < a.b1; ++j) b.W(j) -= dmul(e, b.U(i, j));
  }
  a.row_loss[r] = loss;
  return finite;
}

}  // namespace moesq::ops::sgptq_detail
