// Non-finite values never become finite inside the NVFP4 quantizers (docs/RELIABILITY.md): the
// activation quantizer and fake quant reject a NaN/inf row with an Error naming its column, and the
// E2M1 encoder itself refuses NaN (it used to return +0); a stored global scale so small that the
// largest code decodes to inf is refused by both dequantizers (found by fuzz_compressed in CI).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/fp_codecs.h"
#include "format/nvfp4.h"

namespace {

using moesq::Error;
namespace fmt = moesq::format;

std::vector<float> random_row(int64_t K, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(K);
  for (float& v : x) v = d(rng);
  return x;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(NonFinite, ActivationRowWithNanOrInfIsAnErrorNamingTheColumn) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = random_row(64, 3);
    x[37] = bad;
    const std::string msg = error_of([&] { fmt::quantize_activation_row(x.data(), 64, 32); });
    EXPECT_NE(msg.find("non-finite activation"), std::string::npos) << msg;
    EXPECT_NE(msg.find("column 37"), std::string::npos) << msg;
  }
}

TEST(NonFinite, FiniteActivationRowStillQuantizes) {
  std::vector<float> x = random_row(64, 4);
  const std::vector<float> x0 = x;
  fmt::quantize_activation_row(x.data(), 64, 32);
  int changed = 0;
  for (int i = 0; i < 64; ++i) changed += x[i] != x0[i];
  EXPECT_GT(changed, 0);  // really quantized, not all zeros
}

TEST(NonFinite, FakeQuantRejectsNan) {
  std::vector<float> x = random_row(32, 5);
  x[0] = std::nanf("");
  EXPECT_THROW(fmt::nvfp4_fake_quant_blocks(x.data(), 32, 16, 0.0f), Error);
}

TEST(NonFinite, E2M1EncoderRefusesNan) {
  EXPECT_THROW(fmt::e2m1_encode(std::numeric_limits<float>::quiet_NaN()), Error);
  EXPECT_EQ(fmt::e2m1_encode(std::numeric_limits<float>::infinity()), 7);  // saturates (documented)
  EXPECT_EQ(fmt::e2m1_encode(0.75f), 2);
}

TEST(NonFinite, PackRejectsNonFiniteWeightNamingTheTensor) {
  std::vector<float> W = random_row(2 * 32, 6);
  W[40] = std::numeric_limits<float>::infinity();
  const std::string msg = error_of([&] { fmt::nvfp4_quantize(W.data(), 2, 32, 0.0f, "layers.0.experts.1.up_proj"); });
  EXPECT_NE(msg.find("layers.0.experts.1.up_proj"), std::string::npos) << msg;
}

TEST(NonFinite, DequantizeRefusesAGlobalScaleWhoseLargestCodeOverflows) {
  std::vector<float> W = random_row(2 * 32, 7);
  fmt::Nvfp4Tensor t = fmt::nvfp4_quantize(W.data(), 2, 32, 0.0f, "w");
  std::vector<float> out(W.size());
  fmt::nvfp4_dequantize(t, out.data());  // the quantizer's own γ decodes
  t.global_scale = 1e-37f;               // finite and > 0, but 2688 / 1e-37 = inf
  const std::string msg = error_of([&] { fmt::nvfp4_dequantize(t, out.data()); });
  EXPECT_NE(msg.find("global scale"), std::string::npos) << msg;
  const std::vector<uint8_t> pat = fmt::magnitude_patterns(W.data(), 2, 32);
  fmt::Sparse48Tensor s = fmt::sparse48_quantize(W.data(), 2, 32, pat.data(), 0.0f, "w");
  s.global_scale = 1e-37f;
  EXPECT_NE(error_of([&] { fmt::sparse48_dequantize(s, out.data()); }).find("global scale"), std::string::npos);
  // The rule's boundary is Eq. 5's own range: γ of the largest finite amax decodes.
  EXPECT_EQ(error_of([&] { fmt::check_stored_tensor_scale(fmt::nvfp4_tensor_scale(3.0e38f), "w"); }), "");
  EXPECT_NE(error_of([&] { fmt::check_stored_tensor_scale(std::numeric_limits<float>::denorm_min(), "w"); }), "");
}

}  // namespace
