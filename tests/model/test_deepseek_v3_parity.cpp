// The DeepSeek-V3 family inside the generic decoder, on the tiny-deepseek-v3 fixture (random bf16
// weights; tests/fixtures/families, copied from ../shared/models). The full forward, every layer but
// the last teacher-forced, and the cross-entropy against transformers are test_family_parity's
// "deepseek_v3" case; here: what is particular to this family —
//   - each layer's MLA mixer, fast path against its `_ref` twin on the real weights;
//   - the LAST layer teacher-forced too (its reference output exists only after the final norm);
//   - load errors that name the tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/mixers/mla_mixer.h"
#include "model/tensor_math.h"
#include "support/temp_dir.h"

namespace {

using moesq::model::DecoderModel;

const std::string kModelDir = std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3";
const std::string kRefDir = std::string(MOESQ_FIXTURES) + "/families/tiny-deepseek-v3-reference";

constexpr double kHiddenAtol = 1e-3;  // the family bar for hidden states (fp32, summation order only)
constexpr double kTwinAtol = 1e-5;    // MLA fast vs _ref on the same weights: sgemm blocking vs index order

double max_abs_err(const float* a, const float* b, int64_t n, double* ref_absmax = nullptr) {
  double e = 0, m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    e = std::isnan(d) ? INFINITY : std::max(e, d);
    m = std::max(m, std::fabs(static_cast<double>(b[i])));
  }
  if (ref_absmax) *ref_absmax = m;
  return e;
}

std::vector<float> reference_tensor(const std::string& name, std::vector<int64_t>* shape = nullptr) {
  moesq::io::SafetensorsFile f(kRefDir + "/reference.safetensors");
  if (shape) *shape = f.get(name).shape;
  return moesq::io::to_f32(f.get(name));
}

TEST(DeepseekV3Decoder, EveryLayerHasAnMlaMixerMatchingItsRef) {
  const moesq::io::Checkpoint ck(kModelDir);
  const DecoderModel m(ck);
  const auto& s = m.spec();
  std::vector<int64_t> shape;
  const std::vector<float> h0 = reference_tensor("hidden_states.0", &shape);
  const int64_t T = shape.at(1), H = s.hidden_size;
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const auto* mla = dynamic_cast<const moesq::model::MlaMixer*>(m.layer(l).mixer.get());
    ASSERT_NE(mla, nullptr) << "layer " << l << " mixer is not MLA";
    EXPECT_EQ(mla->name(), "mla");
    std::vector<float> x(T * H);
    moesq::model::rmsnorm_rows(h0.data(), T, H, m.layer(l).input_norm.data(), s.rms_norm_eps, x.data());
    moesq::model::ForwardOptions fo;
    fo.threads = 2;
    const std::vector<float> a = mla->forward(x.data(), T, fo), b = mla->forward_ref(x.data(), T);
    double absmax = 0;
    const double err = max_abs_err(a.data(), b.data(), T * H, &absmax);
    std::printf("layer %lld MLA fast vs ref: max abs err %.3g (max |ref| %.3g)\n", static_cast<long long>(l), err,
                absmax);
    EXPECT_LE(err, kTwinAtol) << "layer " << l;
    EXPECT_GT(absmax, 1e-3) << "layer " << l << ": MLA output is (nearly) all zero";
  }
}

TEST(DeepseekV3Decoder, LastLayerTeacherForcedThroughTheFinalNorm) {
  const moesq::io::Checkpoint ck(kModelDir);
  const DecoderModel m(ck);
  const auto& s = m.spec();
  const int64_t L = s.num_layers, H = s.hidden_size;
  std::vector<int64_t> shape;
  const std::vector<float> in = reference_tensor("hidden_states." + std::to_string(L - 1), &shape);
  const std::vector<float> out = reference_tensor("hidden_states." + std::to_string(L));
  const int64_t B = shape.at(0), T = shape.at(1);
  // As the reference was made (test_family_parity's reference_options): bf16-rounded RoPE
  // frequencies. Measured: max abs err 9.5e-7 with them, 3.7e-5 with fp32 ones.
  moesq::model::ForwardOptions fo;
  fo.rope_bf16_inv_freq = true;
  double err = 0, absmax = 0;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<float> h(&in[b * T * H], &in[(b + 1) * T * H]);
    m.attention_block(L - 1, h, T, fo);
    const std::vector<float> y = m.ffn_block(L - 1, m.moe_input(L - 1, h, T), T, fo);
    for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
    std::vector<float> hn(T * H);
    moesq::model::rmsnorm_rows(h.data(), T, H, m.final_norm_weight().data(), s.rms_norm_eps, hn.data());
    double a = 0;
    err = std::max(err, max_abs_err(hn.data(), &out[b * T * H], T * H, &a));
    absmax = std::max(absmax, a);
  }
  std::printf("layer %lld (+ final norm) teacher-forced: max abs err %.3g (max |ref| %.3g)\n",
              static_cast<long long>(L - 1), err, absmax);
  EXPECT_LE(err, kHiddenAtol);
  EXPECT_GT(absmax, 0.1);
}

// A checkpoint whose tensors do not fit its config (kv_lora_rank 16 in config.json, 32 in the
// files): the error names the layer, the tensor, its shape and the expected one.
TEST(DeepseekV3Decoder, ShapeMismatchNamesTheTensor) {
  moesq::test::TempDir dir("moesq_dsv3");
  namespace fs = std::filesystem;
  for (const auto& f : fs::directory_iterator(kModelDir)) fs::copy_file(f.path(), dir.path / f.path().filename());
  std::ifstream in(kModelDir + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["kv_lora_rank"] = 16;
  fs::remove(dir.file("config.json"));
  dir.write("config.json", cfg.dump());
  const moesq::io::Checkpoint ck(dir.path.string());
  try {
    const DecoderModel m(ck);
    ADD_FAILURE() << "no error";
  } catch (const moesq::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[48, 128]"), std::string::npos) << msg;
  }
}

}  // namespace
