// The KV-cached decoder (data-free calibration sampling) must give the same next-token logits as
// the full forward at every position: same routing, same experts, only the attention is cached.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/kv_decoder.h"
#include "model/decoder.h"

namespace {

// fp32 summation order differs (matvec vs sgemm, per-step vs full softmax): a few ulps of logits
// whose magnitude is ~10, propagated through 4 layers.
constexpr float kLogitAtol = 2e-3f;

TEST(ModelKvDecoder, StepLogitsMatchFullForward) {
  moesq::io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  moesq::model::DecoderModel m(ckpt);
  moesq::io::SafetensorsFile ref(std::string(MOESQ_FIXTURES) + "/tiny-reference.safetensors");
  const std::vector<float> ids = moesq::io::to_f32(ref.get("input_ids"));
  const int64_t T = 48;
  std::vector<int32_t> tokens(ids.begin(), ids.begin() + T);
  const std::vector<float> full = m.forward(tokens, m.default_forward_options());  // [T, V]
  const int64_t V = m.spec().vocab_size;
  moesq::model::KvDecoder dec(m, T, m.default_forward_options());
  float worst = 0;
  int64_t worst_t = -1;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> step = dec.step(tokens[t]);
    ASSERT_EQ(static_cast<int64_t>(step.size()), V);
    for (int64_t v = 0; v < V; ++v) {
      const float d = std::fabs(step[v] - full[t * V + v]);
      if (d > worst) {
        worst = d;
        worst_t = t;
      }
    }
  }
  EXPECT_LT(worst, kLogitAtol) << "worst logit difference at position " << worst_t;
  EXPECT_EQ(dec.position(), T);
  EXPECT_THROW(dec.step(0), moesq::Error) << "stepping past max_len must be an error";
}

}  // namespace
