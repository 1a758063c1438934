// Launchers: synthetic weights made directly in GPU memory from a seed, for `moesq bench e2e
// --synthetic` (no 60 GB checkpoint on disk or host). CPU twins (`_ref`) give the same bits.
//   synth_bf16:        out[i] = bf16(mean + scale·√3·(2u_i − 1)), u_i uniform in [0, 1) from a
//                      counter hash (splitmix64 of seed and i): unit-variance uniform noise × scale.
//   synth_sparse48_kl: paired 4:8 NVFP4 experts directly in the sparse GEMM's kernel layout
//                      (moe/kernel_layout.h): random E2M1 codes, UE4M3 block scales drawn from
//                      [0x30, 0x3f] (0.5 … 0.9375), and random valid ordered-metadata nibbles (one
//                      of the 6 kept-pair patterns) — a valid packing of SOME paired 4:8 tensor, the
//                      same bytes per weight as a real one, so timing and memory are a real model's.
// Non-obvious decision: the sparse weights are drawn in the packed domain instead of packing random
// bf16 by magnitude pairs + RTN; both give random paired 4:8 tensors of identical size and kernel
// work, and this one needs no GPU port of the bit-level layout transform.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#include <cuda_runtime_api.h>
#define MOESQ_HD __host__ __device__
#else
typedef struct CUstream_st* cudaStream_t;
#define MOESQ_HD
#endif

namespace moesq::ops {

MOESQ_HD inline uint64_t synth_hash(uint64_t seed, uint64_t i) {  // splitmix64(seed + (i+1)·φ)
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct SynthBf16Args {
  uint16_t* out = nullptr;  // [n] bf16: elements first … first + n − 1 of the seed's tensor
  int64_t n = 0;
  // The counter of out[0]: a slice of a larger tensor drawn alone has the bits of that slice of the
  // whole (an expert-parallel rank draws its own experts: docs/PARALLEL.md).
  int64_t first = 0;
  uint64_t seed = 0;
  float scale = 1.0f, mean = 0.0f;
};

struct SynthSparseArgs {
  uint8_t* out = nullptr;   // [num_chunks, 1408] kernel-layout chunks first … first + num_chunks − 1
  int64_t num_chunks = 0;
  int64_t first = 0;        // the chunk counter of out's first chunk (SynthBf16Args::first)
  uint64_t seed = 0;
};

void synth_bf16(const SynthBf16Args& args, cudaStream_t stream);
void synth_bf16_ref(const SynthBf16Args& args);
void synth_sparse48_kl(const SynthSparseArgs& args, cudaStream_t stream);
void synth_sparse48_kl_ref(const SynthSparseArgs& args);

// Byte b of chunk c (b < 1408): the one formula both sides use.
MOESQ_HD inline uint8_t synth_sparse_byte(uint64_t seed, int64_t c, int b) {
  constexpr int kCodeBytes = 1024, kScaleBytes = 128;  // format::kChunkCodeBytes, kChunkScaleBytes
  const uint64_t h = synth_hash(seed, static_cast<uint64_t>(c) * 1408u + static_cast<uint64_t>(b));
  if (b < kCodeBytes) return static_cast<uint8_t>(h);
  if (b < kCodeBytes + kScaleBytes) return static_cast<uint8_t>(0x30 + (h & 0xf));
  const uint8_t pat[6] = {0x4, 0x8, 0xc, 0x9, 0xd, 0xe};
  return static_cast<uint8_t>(pat[(h & 0xffff) % 6] | (pat[((h >> 16) & 0xffff) % 6] << 4));
}

MOESQ_HD inline float synth_uniform_value(uint64_t seed, int64_t i, float scale, float mean) {
  const float u = static_cast<float>(synth_hash(seed, static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
  return mean + scale * (1.7320508f * (2.0f * u - 1.0f));
}

}  // namespace moesq::ops
