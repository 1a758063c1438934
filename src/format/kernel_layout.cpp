// Kernel layout transform (kernel_layout.h, docs/KERNEL_LAYOUT.md).
//
// Non-obvious decision: everything is expressed through ONE table, the fragment map of mma.sp
// m16n8k32 (lane, element → row, 2:4 chunk, slot in chunk), used by the packer and by the inverse
// decoder alike, so the two cannot disagree silently; the GPU test then checks the table against
// the hardware.
#include "format/kernel_layout.h"

#include <cstring>

#include "core/error.h"
#include "core/threads.h"
#include "format/fp_codecs.h"

namespace moesq::format {

namespace {

// A-fragment element i (0..7) of lane (g = lane/4, t = lane%4) in one m16n8k32 step:
// row offset (0 or 8) and 2:4 chunk (0..7, four logical K each); elements come in pairs that hold
// the 2 kept values of their chunk (PTX ISA, sparse m16n8k32 .bf16: same map as dense m16n8k16 A).
struct AElem {
  int row_off;
  int chunk;
  int slot;  // 0 / 1: first / second kept value of the chunk
};
inline AElem a_elem(int t, int i) {
  return {(i & 2) ? 8 : 0, t + ((i & 4) ? 4 : 0), i & 1};
}

// 2:4 chunk c of a 32-wide step holds half h = c % 2 of group c / 2 (after the [0,2,4,6,1,3,5,7]
// permutation): slot s of the chunk is kept value (s ? 2 : 0) + h of the group in canonical K order
// (the 4 kept values of a group are w[2·i0], w[2·i0+1], w[2·i1], w[2·i1+1]).
inline int kept_index_in_group(int chunk, int slot) { return (slot ? 2 : 0) + (chunk & 1); }

// Bit position, in a lane's 32-bit code word, of bit b (0..2 magnitude m, e0, e1; 3 sign) of A
// element i. Register k of the fragment holds the pair (a_2k, a_2k+1) as bf16x2; its bits sit where
// that register's bf16 bits must end up (magnitude at bf16 bits 6..8, sign at bit 15, +16 for the
// high half) after ONE word shift for the magnitudes and one for the signs:
//   k = 0: magnitudes at 6, signs at 15   → w & mask                 (no shift)
//   k = 1: magnitudes at 3, signs at 12   → (w << 3) & mask          (one shift)
//   k = 2: magnitudes at 9, signs at 14   → (w >> 3) & m | (w << 1) & s
//   k = 3: magnitudes at 0, signs at 13   → (w << 6) & m | (w << 2) & s
// The 4 × 8 bits tile the word exactly (KernelLayout.CodeBitsTileTheWord checks it).
constexpr int kMagBase[4] = {6, 3, 9, 0};
constexpr int kSignPos[4] = {15, 12, 14, 13};
inline int code_bit_pos(int i, int b) {
  const int k = i >> 1, half = 16 * (i & 1);
  return half + (b == 3 ? kSignPos[k] : kMagBase[k] + b);
}
inline uint32_t put_code(int i, uint8_t code) {
  uint32_t w = 0;
  for (int b = 0; b < 4; ++b) w |= static_cast<uint32_t>((code >> b) & 1u) << code_bit_pos(i, b);
  return w;
}
inline uint8_t get_code(uint32_t word, int i) {
  uint8_t c = 0;
  for (int b = 0; b < 4; ++b) c |= static_cast<uint8_t>(((word >> code_bit_pos(i, b)) & 1u) << b);
  return c;
}

// Metadata bytes of lane (g, t) in a chunk: 16 bytes = 4 step pairs × 4 bytes; byte j of pair p holds
// the j-th stored nibble of step 2p in its low half and of step 2p+1 in its high half, so the kernel
// expands a step to the mma.sp register (each nibble doubled) with a mask and one multiply by 0x11.
inline int meta_byte(int s, int j) { return (s / 2) * 4 + j; }
inline int meta_shift(int s) { return 4 * (s & 1); }

inline uint8_t get_nibble(const uint8_t* bytes, int64_t idx) {
  return (bytes[idx >> 1] >> ((idx & 1) * 4)) & 0xf;
}

constexpr uint8_t kPadNibble = 0x4;  // pattern {0,1}: a valid ordered-metadata nibble for padding

}  // namespace

int kernel_code_bit(int element, int bit) {
  MOESQ_CHECK(element >= 0 && element < 8 && bit >= 0 && bit < 4, "kernel_code_bit: element=", element, " bit=", bit);
  return code_bit_pos(element, bit);
}

int64_t padded_k(int64_t K) { return (K + kChunkK - 1) / kChunkK * kChunkK; }

const char* act_layout_name(ActLayout layout) {
  switch (layout) {
    case ActLayout::kMmaFragment: return "mma-fragment";
    case ActLayout::kKMajor: return "k-major";
  }
  MOESQ_FAIL("act_layout_name: unknown ActLayout ", static_cast<int>(layout));
}

int64_t act_storage_index(int64_t k, ActLayout layout) {
  MOESQ_CHECK(layout == ActLayout::kMmaFragment || layout == ActLayout::kKMajor,
              "act_storage_index: unknown ActLayout ", static_cast<int>(layout));
  const int64_t base = k / kMmaK * kMmaK;
  const int kk = static_cast<int>(k % kMmaK);
  const int grp = kk / 8, j = kk % 8;
  const int c = 8 * grp + 4 * (j & 1) + (j >> 1);  // 4:8 → 2:4 permutation [0,2,4,6,1,3,5,7]
  if (layout == ActLayout::kKMajor) return base + c;
  // B fragment of m16n8k32: lane t holds K rows 2t + (i&1) + 8·(i>>1), i = 0..7; store them
  // contiguously at 8t + i.
  const int t = (c % 8) / 2, i = (c & 1) + 2 * (c / 8);
  return base + 8 * t + i;
}

KernelWeights kernel_layout_from_sparse48(const std::vector<const format::Sparse48Tensor*>& experts,
                                          const std::string& name, MetaOrder meta_order) {
  MOESQ_CHECK(!experts.empty(), name, ": no experts to lay out");
  KernelWeights w;
  w.num_experts = static_cast<int>(experts.size());
  w.M = experts[0]->N;
  w.K = experts[0]->K;
  w.meta_order = meta_order;
  MOESQ_CHECK(w.M > 0 && w.K > 0 && w.K % kMmaK == 0, name, ": K=", w.K, " must be a positive multiple of ",
              kMmaK, " (M=", w.M, ")");
  for (int e = 0; e < w.num_experts; ++e) {
    const auto& t = *experts[e];
    MOESQ_CHECK(t.N == w.M && t.K == w.K, name, "[", e, "]: shape [", t.N, ", ", t.K, "] differs from [", w.M, ", ",
                w.K, "]");
    MOESQ_CHECK(t.values.size() == static_cast<size_t>(t.N * t.K / 4) &&
                    t.meta.size() == static_cast<size_t>(t.N * t.K / 16) &&
                    t.scales.size() == static_cast<size_t>(t.N * t.K / 32),
                name, "[", e, "]: packed buffers do not match [", t.N, ", ", t.K, "]");
  }
  w.M_pad = (w.M + kMmaM - 1) / kMmaM * kMmaM;
  w.K_pad = padded_k(w.K);
  w.gamma.resize(w.num_experts);
  w.data.assign(w.expert_bytes() * w.num_experts, 0);
  const int64_t MT = w.m_tiles(), KC = w.k_chunks();
  const int64_t groups_per_row = w.K / 8;

  parallel_for(w.num_experts * MT, [&](int64_t job) {
    const int e = static_cast<int>(job / MT);
    const int64_t mt = job % MT;
    const auto& t = *experts[e];
    for (int64_t kc = 0; kc < KC; ++kc) {
      uint8_t* chunk = w.data.data() + ((e * MT + mt) * KC + kc) * kChunkBytes;
      uint8_t* codes = chunk;
      uint8_t* scales = chunk + kChunkCodeBytes;
      uint8_t* meta = scales + kChunkScaleBytes;
      for (int s = 0; s < kKStepsPerChunk; ++s) {
        const int64_t k0 = kc * kChunkK + s * kMmaK;  // first logical K of this step
        const int64_t grp0 = k0 / 8;                   // first group of this step
        const bool k_valid = k0 < w.K;
        auto nibble_of = [&](int64_t row, int g4) -> uint8_t {  // meta nibble of group g4 (0..3) of step
          if (row >= w.M || !k_valid) return kPadNibble;
          return get_nibble(t.meta.data(), row * groups_per_row + grp0 + g4);
        };
        // codes: lane word, A element i's bits at code_bit_pos(i, ·)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, tl = lane % 4;
          uint32_t word = 0;
          for (int i = 0; i < 8; ++i) {
            const AElem a = a_elem(tl, i);
            const int64_t row = mt * kMmaM + g + a.row_off;
            uint8_t code = 0;
            // A weight of a zero-scale block is 0 whatever its code: store code 0, so that the kernel's
            // scale conversion needs no zero test (sparse_gemm.cu, ue4m3x2_to_bf16x2_x2p119).
            const bool zero_scale = row < w.M && k_valid && t.scales[row * (w.K / 32) + k0 / 32] == 0;
            if (row < w.M && k_valid && !zero_scale) {
              const int64_t grp = grp0 + a.chunk / 2;
              const int64_t kept = grp * 4 + kept_index_in_group(a.chunk, a.slot);  // index in the row's K/2
              code = get_nibble(t.values.data(), row * (w.K / 2) + kept);
            }
            word |= put_code(i, code);
          }
          std::memcpy(codes + (s / 4) * 512 + lane * 16 + (s % 4) * 4, &word, 4);
        }
        for (int g = 0; g < 8; ++g) {
          for (int r = 0; r < 2; ++r) {
            const int64_t row = mt * kMmaM + g + 8 * r;
            scales[g * 16 + s * 2 + r] = (row < w.M && k_valid) ? t.scales[row * (w.K / 32) + k0 / 32] : 0;
          }
          for (int tl = 0; tl < 2; ++tl) {
            uint8_t* m = meta + (g * 2 + tl) * 16;
            const int64_t rg = mt * kMmaM + g;
            uint8_t nib[4];  // stored nibbles j = 0..3 of this lane and step
            if (meta_order == MetaOrder::kHalfK) {
              nib[0] = nibble_of(rg, 2 * tl);
              nib[1] = nibble_of(rg, 2 * tl + 1);
              nib[2] = nibble_of(rg + 8, 2 * tl);
              nib[3] = nibble_of(rg + 8, 2 * tl + 1);
            } else {
              const int64_t row = rg + 8 * tl;
              for (int j = 0; j < 4; ++j) nib[j] = nibble_of(row, j);
            }
            for (int j = 0; j < 4; ++j) m[meta_byte(s, j)] |= static_cast<uint8_t>(nib[j] << meta_shift(s));
          }
        }
      }
    }
  });
  for (int e = 0; e < w.num_experts; ++e) w.gamma[e] = experts[e]->global_scale;
  return w;
}

void kernel_layout_unpack_ref(const KernelWeights& w, int e, float* out) {
  MOESQ_CHECK(e >= 0 && e < w.num_experts, "kernel_layout_unpack_ref: expert ", e, " out of [0, ", w.num_experts,
              ")");
  kernel_layout_unpack_ref(w.data.data() + e * w.expert_bytes(), w.M, w.K, w.M_pad, w.K_pad, w.meta_order, out);
}

void kernel_layout_unpack_ref(const uint8_t* expert, int64_t M, int64_t K, int64_t M_pad, int64_t K_pad,
                              MetaOrder meta_order, float* out) {
  struct {
    int64_t M, K;
    MetaOrder meta_order;
  } w{M, K, meta_order};
  std::memset(out, 0, sizeof(float) * w.M * w.K);
  const int64_t MT = M_pad / kMmaM, KC = K_pad / kChunkK;
  for (int64_t mt = 0; mt < MT; ++mt) {
    for (int64_t kc = 0; kc < KC; ++kc) {
      const uint8_t* chunk = expert + (mt * KC + kc) * kChunkBytes;
      const uint8_t* scales = chunk + kChunkCodeBytes;
      const uint8_t* meta = scales + kChunkScaleBytes;
      for (int s = 0; s < kKStepsPerChunk; ++s) {
        const int64_t k0 = kc * kChunkK + s * kMmaK;
        if (k0 >= w.K) continue;
        // Rebuild each row's 8 ordered-metadata nibbles (one per 2:4 chunk) as the hardware reads them.
        uint8_t chunk_nib[kMmaM][8];
        for (int g = 0; g < 8; ++g) {
          for (int tl = 0; tl < 2; ++tl) {
            const uint8_t* m = meta + (g * 2 + tl) * 16;
            uint8_t x[4];
            for (int j = 0; j < 4; ++j) x[j] = (m[meta_byte(s, j)] >> meta_shift(s)) & 0xf;
            for (int q = 0; q < 4; ++q) {
              int row, ch;
              if (w.meta_order == MetaOrder::kHalfK) {
                row = g + (q >= 2 ? 8 : 0);
                ch = 4 * tl + 2 * (q & 1);
              } else {
                row = g + 8 * tl;
                ch = 2 * q;
              }
              chunk_nib[row][ch] = chunk_nib[row][ch + 1] = x[q];
            }
          }
        }
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, tl = lane % 4;
          uint32_t word;
          std::memcpy(&word, chunk + (s / 4) * 512 + lane * 16 + (s % 4) * 4, 4);
          for (int i = 0; i < 8; ++i) {
            const AElem a = a_elem(tl, i);
            const int r = g + a.row_off;
            const int64_t row = mt * kMmaM + r;
            if (row >= w.M) continue;
            const uint8_t nib = chunk_nib[r][a.chunk];
            const int pos_in_chunk = a.slot ? (nib >> 2) : (nib & 3);  // 2:4 index inside the chunk
            // chunk → logical K: chunk c holds half h = c%2 of group c/2; 2:4 position p = pair index.
            const int64_t k = k0 + 8 * (a.chunk / 2) + 2 * pos_in_chunk + (a.chunk & 1);
            const uint8_t code = get_code(word, i);
            const uint8_t sc = scales[g * 16 + s * 2 + (a.row_off ? 1 : 0)];
            out[row * w.K + k] = format::e2m1_decode(code) * format::e4m3_decode(sc);
          }
        }
      }
    }
  }
}

namespace {
inline uint8_t nibble_at(const uint8_t* bytes, int64_t idx) { return (bytes[idx >> 1] >> ((idx & 1) * 4)) & 0xf; }
}  // namespace

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

}  // namespace moesq::format
