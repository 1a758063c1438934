// The layer-record codec (compress/layer_record.h) that carries experts between ranks and into the
// resume work dir: a round trip gives back the same bits (packed tensors, doubles incl. NaN, the
// report JSON), and damaged or truncated bytes are errors naming the source, never wrong experts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "compress/layer_record.h"
#include "core/error.h"
#include "format/nvfp4.h"
#include "support/packed_weight_eq.h"

namespace moesq::compress {
namespace {

std::vector<float> random_weights(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(static_cast<size_t>(n));
  for (float& x : w) x = d(rng);
  return w;
}

ExpertResult random_expert(int64_t layer, int64_t expert, bool sparse, std::mt19937& rng) {
  constexpr int64_t H = 64, I = 32;
  ExpertResult x;
  for (int p = 0; p < 3; ++p) {
    const int64_t N = p < 2 ? I : H, K = p < 2 ? H : I;
    const std::vector<float> W = random_weights(N * K, rng);
    if (sparse) {
      const std::vector<uint8_t> pat = format::magnitude_patterns(W.data(), N, K);
      x.packed.proj[static_cast<size_t>(p)] = format::sparse48_quantize(W.data(), N, K, pat.data());
    } else {
      x.packed.proj[static_cast<size_t>(p)] = format::nvfp4_quantize(W.data(), N, K);
    }
  }
  x.report.layer = layer;
  x.report.expert = expert;
  x.report.tokens = static_cast<int64_t>(rng() % 1000);
  x.report.rel_error = expert == 1 ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(double(rng()), -40);
  x.report.fallback = expert % 2 == 1;
  x.report.note = expert == 1 ? "no calibration tokens" : "";
  if (expert != 2)
    x.report.extra = {{"init_hard_loss", 0.1 + 1e-17 * double(expert)},
                      {"soft_loss", {1.0 / 3.0, -0.0, 1e-310, 12345678901.5}},
                      {"steps", int64_t(expert) * 7},
                      {"skipped", false}};
  return x;
}

TEST(LayerRecord, RoundTripKeepsEveryBit) {
  std::mt19937 rng(11);
  for (bool sparse : {true, false}) {
    LayerRecord r;
    r.layer = 3;
    r.run_sha256 = std::string(64, 'a');
    r.next_inputs_sha256 = std::string(64, 'b');
    for (int64_t e : {0, 1, 2, 5}) r.experts.push_back(random_expert(3, e, sparse, rng));
    const std::string bytes = encode_layer_record(r);
    const LayerRecord d = decode_layer_record(bytes, "test");
    EXPECT_EQ(d.layer, 3);
    EXPECT_EQ(d.run_sha256, r.run_sha256);
    EXPECT_EQ(d.next_inputs_sha256, r.next_inputs_sha256);
    ASSERT_EQ(d.experts.size(), r.experts.size());
    for (size_t i = 0; i < r.experts.size(); ++i) {
      const ExpertReport &a = r.experts[i].report, &b = d.experts[i].report;
      const std::string what = "expert " + std::to_string(a.expert) + (sparse ? " (4:8)" : " (dense)");
      EXPECT_EQ(a.layer, b.layer) << what;
      EXPECT_EQ(a.expert, b.expert) << what;
      EXPECT_EQ(a.tokens, b.tokens) << what;
      EXPECT_EQ(std::memcmp(&a.rel_error, &b.rel_error, sizeof(double)), 0) << what << ": rel_error bits";
      EXPECT_EQ(a.fallback, b.fallback) << what;
      EXPECT_EQ(a.note, b.note) << what;
      // report.json is written from the decoded JSON: its text must be the original's.
      EXPECT_EQ(a.extra.dump(), b.extra.dump()) << what;
      for (size_t p = 0; p < 3; ++p) test::expect_same_bits(r.experts[i].packed.proj[p], d.experts[i].packed.proj[p], what);
    }
    EXPECT_EQ(encode_layer_record(d), bytes) << "re-encoding gives the same bytes";
  }
}

TEST(LayerRecord, EmptyShareIsValid) {
  LayerRecord r;
  r.layer = 1;  // a rank without experts (N > E) still sends a record
  const LayerRecord d = decode_layer_record(encode_layer_record(r), "rank 5");
  EXPECT_EQ(d.layer, 1);
  EXPECT_TRUE(d.experts.empty());
}

TEST(LayerRecord, DamagedOrTruncatedBytesAreErrorsNamingTheSource) {
  std::mt19937 rng(5);
  LayerRecord r;
  r.experts.push_back(random_expert(0, 0, true, rng));
  const std::string bytes = encode_layer_record(r);
  auto message = [](const std::string& b) {
    try {
      decode_layer_record(b, "/w/layer_0000.rec");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  EXPECT_NE(message(flipped).find("/w/layer_0000.rec: checksum mismatch"), std::string::npos) << message(flipped);
  EXPECT_NE(message(bytes.substr(0, bytes.size() - 100)).find("/w/layer_0000.rec"), std::string::npos);
  EXPECT_NE(message("").find("not a moesq layer record"), std::string::npos);
  EXPECT_NE(message(std::string(200, 'x')).find("not a moesq layer record"), std::string::npos);
}

}  // namespace
}  // namespace moesq::compress
