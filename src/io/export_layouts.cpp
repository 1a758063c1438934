// Conversions between paired 4:8 NVFP4, dense NVFP4 (compressed-tensors nvfp4-pack-quantized) and the
// pair-bitmask layout (export_layouts.h; docs/FORMAT.md §8–§10). Byte moves only: no value is
// re-quantized, so every conversion keeps the dequantized floats bit for bit.
#include "io/export_layouts.h"

#include "core/error.h"

namespace moesq::io {

namespace {

constexpr int64_t kChunk = 4;  // dense bytes per 4:8 group (8 weights, one pair per byte)

inline uint8_t nibble_at(const uint8_t* bytes, int64_t i) {
  return (i & 1) ? static_cast<uint8_t>(bytes[i >> 1] >> 4) : static_cast<uint8_t>(bytes[i >> 1] & 0x0f);
}
inline void set_nibble(uint8_t* bytes, int64_t i, uint8_t v) {
  uint8_t& b = bytes[i >> 1];
  b = (i & 1) ? static_cast<uint8_t>((b & 0x0f) | (v << 4)) : static_cast<uint8_t>((b & 0xf0) | v);
}

// Two set bits of a mask nibble (i0 < i1), false unless exactly two are set.
bool mask_bits(uint8_t m, int& i0, int& i1) {
  i0 = i1 = -1;
  for (int i = 0; i < 4; ++i)
    if (m & (1u << i)) {
      if (i0 < 0) i0 = i;
      else if (i1 < 0) i1 = i;
      else return false;
    }
  return i1 >= 0;
}

// 16-block scales [N, K/16] pairwise equal? First offending (row, 32-block) in *row / *blk.
bool scales_pairwise_equal(const std::vector<uint8_t>& s, int64_t N, int64_t K, int64_t* row, int64_t* blk) {
  const int64_t B = K / 32;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < B; ++j)
      if (s[n * 2 * B + 2 * j] != s[n * 2 * B + 2 * j + 1]) {
        if (row) *row = n;
        if (blk) *blk = j;
        return false;
      }
  return true;
}

format::Sparse48Tensor sparse_from_dense_and_masks(const format::Nvfp4Tensor& d, const std::vector<uint8_t>& mask) {
  const int64_t N = d.N, K = d.K, G = K / 8;
  format::Sparse48Tensor t;
  t.N = N;
  t.K = K;
  t.global_scale = d.global_scale;
  t.values.assign(static_cast<size_t>(N * K / 4), 0);
  t.meta.assign(static_cast<size_t>(N * K / 16), 0);
  t.scales.resize(static_cast<size_t>(N * K / 32));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      int i0, i1;
      mask_bits(nibble_at(mask.data() + n * K / 16, g), i0, i1);
      const uint8_t* chunk = d.values.data() + n * K / 2 + g * kChunk;
      t.values[n * K / 4 + 2 * g] = chunk[i0];
      t.values[n * K / 4 + 2 * g + 1] = chunk[i1];
      set_nibble(t.meta.data() + n * K / 16, g, static_cast<uint8_t>(i0 | (i1 << 2)));
    }
    for (int64_t j = 0; j < K / 32; ++j) t.scales[n * K / 32 + j] = d.scales[n * K / 16 + 2 * j];
  }
  return t;
}

// Data-derived masks of a dense tensor; false when some chunk has more than two nonzero bytes.
bool chunk_masks(const format::Nvfp4Tensor& d, std::vector<uint8_t>& mask, int64_t* row, int64_t* grp) {
  const int64_t N = d.N, K = d.K, G = K / 8;
  mask.assign(static_cast<size_t>(N * K / 16), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int m = chunk_pair_mask(d.values.data() + n * K / 2 + g * kChunk);
      if (m < 0) {
        if (row) *row = n;
        if (grp) *grp = g;
        return false;
      }
      set_nibble(mask.data() + n * K / 16, g, static_cast<uint8_t>(m));
    }
  return true;
}

void check_dense_sizes(const format::Nvfp4Tensor& d, const std::string& name) {
  MOESQ_CHECK(d.K > 0 && d.K % 32 == 0, "tensor ", name, ": K = ", d.K, " is not a multiple of 32 (paired 4:8)");
  MOESQ_CHECK(d.values.size() == static_cast<size_t>(d.N * d.K / 2) &&
                  d.scales.size() == static_cast<size_t>(d.N * d.K / 16),
              "tensor ", name, ": dense NVFP4 arrays do not match [", d.N, ", ", d.K, "]");
}

}  // namespace

int chunk_pair_mask(const uint8_t* chunk4) {
  int m = 0, bits = 0;
  for (int i = 0; i < 4; ++i)
    if (chunk4[i] != 0) {
      m |= 1 << i;
      ++bits;
    }
  if (bits > 2) return -1;
  for (int i = 0; i < 4 && bits < 2; ++i)
    if (!(m & (1 << i))) {
      m |= 1 << i;
      ++bits;
    }
  return m;
}

format::Nvfp4Tensor to_dense_nvfp4(const format::PackedWeight& p) {
  if (const format::Nvfp4Tensor* d = p.nvfp4()) return *d;
  const format::Sparse48Tensor& s = *p.sparse48();
  const int64_t N = s.N, K = s.K, G = K / 8;
  format::Nvfp4Tensor d;
  d.N = N;
  d.K = K;
  d.global_scale = s.global_scale;
  d.values.assign(static_cast<size_t>(N * K / 2), 0);
  d.scales.resize(static_cast<size_t>(N * K / 16));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      const int pat = format::pattern_from_nibble(nibble_at(s.meta.data() + n * K / 16, g));
      uint8_t* chunk = d.values.data() + n * K / 2 + g * kChunk;
      chunk[format::kPatternPairs[pat][0]] = s.values[n * K / 4 + 2 * g];
      chunk[format::kPatternPairs[pat][1]] = s.values[n * K / 4 + 2 * g + 1];
    }
    for (int64_t j = 0; j < K / 32; ++j)
      d.scales[n * K / 16 + 2 * j] = d.scales[n * K / 16 + 2 * j + 1] = s.scales[n * K / 32 + j];
  }
  return d;
}

PairBitmaskTensor to_pair_bitmask(const format::Nvfp4Tensor& d, const std::string& name) {
  check_dense_sizes(d, name);
  int64_t row = 0, at = 0;
  MOESQ_CHECK(scales_pairwise_equal(d.scales, d.N, d.K, &row, &at), "tensor ", name, ": 16-block scales ", 2 * at,
              " and ", 2 * at + 1, " of row ", row, " differ, so it is not a paired 4:8 tensor (pair-bitmask "
              "needs a paired 4:8 source)");
  std::vector<uint8_t> mask;
  MOESQ_CHECK(chunk_masks(d, mask, &row, &at), "tensor ", name, ": row ", row, " chunk ", at,
              " has more than two nonzero bytes, so it is not a paired 4:8 tensor (pair-bitmask needs a paired "
              "4:8 source)");
  const format::Sparse48Tensor s = sparse_from_dense_and_masks(d, mask);
  PairBitmaskTensor b;
  b.N = d.N;
  b.K = d.K;
  b.packed = s.values;
  b.mask = std::move(mask);
  b.scales = d.scales;
  b.global_scale = d.global_scale;
  return b;
}

format::Sparse48Tensor pair_bitmask_to_sparse48(const PairBitmaskTensor& b, const std::string& name) {
  const int64_t N = b.N, K = b.K, G = K / 8;
  MOESQ_CHECK(K > 0 && K % 32 == 0, "tensor ", name, ": K = ", K, " is not a multiple of 32 (paired 4:8)");
  MOESQ_CHECK(b.packed.size() == static_cast<size_t>(N * K / 4) && b.mask.size() == static_cast<size_t>(N * K / 16) &&
                  b.scales.size() == static_cast<size_t>(N * K / 16),
              "tensor ", name, ": pair-bitmask arrays do not match [", N, ", ", K, "]");
  int64_t row = 0, at = 0;
  MOESQ_CHECK(scales_pairwise_equal(b.scales, N, K, &row, &at), "tensor ", name, ": 16-block scales ", 2 * at,
              " and ", 2 * at + 1, " of row ", row, " differ (pair-bitmask stores each 32-block scale twice)");
  format::Sparse48Tensor t;
  t.N = N;
  t.K = K;
  t.global_scale = b.global_scale;
  t.values = b.packed;
  t.meta.assign(static_cast<size_t>(N * K / 16), 0);
  t.scales.resize(static_cast<size_t>(N * K / 32));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t m = nibble_at(b.mask.data() + n * K / 16, g);
      int i0, i1;
      MOESQ_CHECK(mask_bits(m, i0, i1), "tensor ", name, ": mask nibble 0x", std::hex, int(m), std::dec, " of row ",
                  n, " chunk ", g, " does not have exactly two bits set");
      set_nibble(t.meta.data() + n * K / 16, g, static_cast<uint8_t>(i0 | (i1 << 2)));
    }
    for (int64_t j = 0; j < K / 32; ++j) t.scales[n * K / 32 + j] = b.scales[n * K / 16 + 2 * j];
  }
  return t;
}

std::optional<format::Sparse48Tensor> detect_sparse48(const format::Nvfp4Tensor& d) {
  if (d.K <= 0 || d.K % 32 != 0) return std::nullopt;
  if (!scales_pairwise_equal(d.scales, d.N, d.K, nullptr, nullptr)) return std::nullopt;
  std::vector<uint8_t> mask;
  if (!chunk_masks(d, mask, nullptr, nullptr)) return std::nullopt;
  return sparse_from_dense_and_masks(d, mask);
}

format::Sparse48Tensor canonical_sparse48(const format::Sparse48Tensor& t, int64_t* changed) {
  format::Sparse48Tensor c = *detect_sparse48(to_dense_nvfp4(t));
  if (changed) {
    *changed = 0;
    for (size_t i = 0; i < t.meta.size(); ++i) {
      *changed += (t.meta[i] & 0x0f) != (c.meta[i] & 0x0f);
      *changed += (t.meta[i] >> 4) != (c.meta[i] >> 4);
    }
  }
  return c;
}

}  // namespace moesq::io
