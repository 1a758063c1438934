// gpt-oss fused expert tensors → per-expert Linear layout (see the header). The unpacking is a pure
// re-indexing: every value is copied, none is rounded, so a compressed gpt-oss checkpoint starts from
// exactly the source weights.
#include "model/fused_experts.h"

#include "core/error.h"

namespace moesq::model {

void unpack_fused_gate_up(const float* gate_up, const float* gate_up_bias, int64_t E, int64_t H, int64_t I, int64_t e,
                          ExpertWeights& w) {
  MOESQ_CHECK(e >= 0 && e < E, "gpt-oss experts: expert ", e, " of ", E);
  if (gate_up) {
    const float* gu = &gate_up[e * H * 2 * I];  // [H, 2I]
    w.gate.resize(I * H);
    w.up.resize(I * H);
    for (int64_t c = 0; c < H; ++c)
      for (int64_t i = 0; i < I; ++i) {
        w.gate[i * H + c] = gu[c * 2 * I + 2 * i];
        w.up[i * H + c] = gu[c * 2 * I + 2 * i + 1];
      }
  }
  w.gate_bias.resize(I);
  w.up_bias.resize(I);
  for (int64_t i = 0; i < I; ++i) {
    w.gate_bias[i] = gate_up_bias[e * 2 * I + 2 * i];
    w.up_bias[i] = gate_up_bias[e * 2 * I + 2 * i + 1];
  }
}

void unpack_fused_down(const float* down, const float* down_bias, int64_t E, int64_t H, int64_t I, int64_t e,
                       ExpertWeights& w) {
  MOESQ_CHECK(e >= 0 && e < E, "gpt-oss experts: expert ", e, " of ", E);
  if (down) {
    const float* d = &down[e * I * H];  // [I, H]
    w.down.resize(H * I);
    for (int64_t i = 0; i < I; ++i)
      for (int64_t c = 0; c < H; ++c) w.down[c * I + i] = d[i * H + c];
  }
  w.down_bias.assign(down_bias + e * H, down_bias + (e + 1) * H);
}

}  // namespace moesq::model
