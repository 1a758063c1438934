// CPU twins of the synthetic weight generators (synth_pack.h).
#include "core/error.h"
#include "core/half.h"
#include "ops/synth_pack/synth_pack.h"

namespace moesq::ops {

void synth_bf16_ref(const SynthBf16Args& a) {
  MOESQ_CHECK(a.n >= 0 && a.first >= 0, "synth_bf16: n=", a.n, " first=", a.first);
  for (int64_t i = 0; i < a.n; ++i) a.out[i] = f32_to_bf16(synth_uniform_value(a.seed, a.first + i, a.scale, a.mean));
}

void synth_sparse48_kl_ref(const SynthSparseArgs& a) {
  MOESQ_CHECK(a.num_chunks >= 0 && a.first >= 0, "synth_sparse48_kl: num_chunks=", a.num_chunks, " first=", a.first);
  for (int64_t c = 0; c < a.num_chunks; ++c)
    for (int b = 0; b < 1408; ++b) a.out[c * 1408 + b] = synth_sparse_byte(a.seed, a.first + c, b);
}

}  // namespace moesq::ops
