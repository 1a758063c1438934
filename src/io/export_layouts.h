// The byte layouts moesq exports besides its own (docs/FORMAT.md §8, §9), as pure conversions between
// in-memory tensors; io/export_checkpoint.* and io/import_checkpoint.* move them to and from files.
//
//  * compressed-tensors `nvfp4-pack-quantized` = dense NVFP4 (format::Nvfp4Tensor): values [N, K/2]
//    (low nibble = lower K), UE4M3 scales [N, K/16], γ a divisor. A paired 4:8 tensor becomes one by
//    writing zero codes at pruned positions and each 32-block scale as two equal 16-block scales.
//  * moesq `pair-bitmask`: the dense packing with the two zero bytes of every 4-byte chunk dropped.
//    Byte i of a chunk (8 weights = one 4:8 group) holds pair i, so the kept bytes of a chunk are the
//    kept pairs. mask [N, K/16]: one nibble per chunk (low nibble = even chunk), bit i = byte i kept,
//    exactly two bits. The mask is a function of the DATA (chunk_pair_mask): the nonzero bytes, and
//    when fewer than two are nonzero the lowest-index zero bytes fill up to two.
//
// Detection (import): a dense NVFP4 tensor IS paired 4:8 when K % 32 == 0, every chunk has at most two
// nonzero bytes and every pair of 16-block scales (2j, 2j+1) is equal; it converts back to the
// Sparse48Tensor whose patterns are the chunk masks (canonical_sparse48 of the original).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/packed_weight.h"

namespace moesq::io {

struct PairBitmaskTensor {
  int64_t N = 0, K = 0;
  std::vector<uint8_t> packed;  // [N, K/4]  the 2 kept bytes of every 4 dense bytes, in K order
  std::vector<uint8_t> mask;    // [N, K/16] one nibble per 4-byte chunk, low nibble = lower-K chunk
  std::vector<uint8_t> scales;  // [N, K/16] UE4M3 (pairwise equal)
  float global_scale = 1.0f;    // γ (divisor)
};

// Mask nibble of one 4-byte chunk of the dense packing: bit i set for each nonzero byte i, then the
// lowest-index zero bytes until two bits are set. -1 when more than two bytes are nonzero.
int chunk_pair_mask(const uint8_t* chunk4);

// Paired 4:8 → dense NVFP4 (zero codes where pruned, 32-block scale written twice); dense → copy.
// Dequantizing the result gives bitwise the same floats as dequantizing `p`.
format::Nvfp4Tensor to_dense_nvfp4(const format::PackedWeight& p);

// Dense NVFP4 (from to_dense_nvfp4 of a paired 4:8 tensor) → pair-bitmask. Error naming `name`, the
// row and the chunk when a chunk has more than two nonzero bytes or a 16-block scale pair differs.
PairBitmaskTensor to_pair_bitmask(const format::Nvfp4Tensor& d, const std::string& name);
// Pair-bitmask → our paired 4:8 tensor (values are the same bytes; meta from the mask; every other
// scale). Error naming `name`, row and chunk for a nibble without exactly two bits or unequal scales.
format::Sparse48Tensor pair_bitmask_to_sparse48(const PairBitmaskTensor& b, const std::string& name);

// The detection rule above: the paired 4:8 tensor a dense NVFP4 tensor holds, or nullopt.
std::optional<format::Sparse48Tensor> detect_sparse48(const format::Nvfp4Tensor& d);

// The form every export → import round trip returns: a kept pair whose two codes are both 0x00 is
// re-assigned by chunk_pair_mask (lowest-index zero pairs). Same dequantized floats; the same bytes
// whenever no kept pair of `t` is all-zero. Counts such chunks in *changed when given.
format::Sparse48Tensor canonical_sparse48(const format::Sparse48Tensor& t, int64_t* changed = nullptr);

}  // namespace moesq::io
