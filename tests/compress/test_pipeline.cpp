// Algorithm 1 on a small synthetic Qwen3-MoE: every routed token is cached once per layer, experts
// that receive no calibration tokens get the documented fallback (never NaN), the compressed
// experts are installed in the model, and SGPTQ's per-expert reconstruction error beats magnitude's.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "compress/calib.h"
#include "core/error.h"
#include "compress/pipeline.h"
#include "compress/refine/step_backend.h"
#include "model/decoder.h"

namespace {

moesq::io::ModelSpec small_spec() {
  moesq::io::ModelSpec s;
  s.model_type = "qwen3_moe";
  s.vocab_size = 64;
  s.hidden_size = 64;
  s.intermediate_size = 128;
  s.moe_intermediate_size = 32;
  s.num_layers = 2;
  s.num_heads = 2;
  s.num_kv_heads = 1;
  s.head_dim = 32;
  s.num_experts = 6;
  s.top_k = 2;
  return s;
}

void fill(std::vector<float>& v, std::mt19937& rng, float sd, float mean = 0.0f) {
  std::normal_distribution<float> nd(mean, sd);
  for (auto& x : v) x = nd(rng);
}

moesq::model::DecoderModel random_model(uint32_t seed) {
  moesq::model::DecoderModel m(small_spec());
  std::mt19937 rng(seed);
  fill(m.lm_head_weight(), rng, 0.1f);
  for (auto& x : m.final_norm_weight()) x = 1.0f;
  for (int64_t l = 0; l < 2; ++l) {
    auto& L = m.layer(l);
    for (auto* v : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj}) fill(*v, rng, 0.1f);
    for (auto* v : {&L.input_norm, &L.post_norm, &L.q_norm, &L.k_norm}) for (auto& x : *v) x = 1.0f;
    fill(L.router, rng, 0.3f);
    // Expert 5 never wins: a constant negative router row against positive-mean hidden states
    // (the embeddings below) gives it a very negative logit for every token.
    for (int64_t h = 0; h < 64; ++h) L.router[5 * 64 + h] = -50.0f;
    for (auto& e : L.experts) {
      fill(e.gate, rng, 0.2f);
      fill(e.up, rng, 0.2f);
      fill(e.down, rng, 0.2f);
    }
  }
  fill(m.embed_weight(), rng, 1.0f, 2.0f);
  return m;
}

moesq::compress::CalibSet calib(int64_t S, int64_t T, uint32_t seed) {
  moesq::compress::CalibSet c;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, 63);
  for (int64_t s = 0; s < S; ++s) {
    c.sequences.emplace_back();
    for (int64_t t = 0; t < T; ++t) c.sequences.back().push_back(tok(rng));
  }
  return c;
}

TEST(CompressPipeline, CountsFallbacksAndInstallsExperts) {
  moesq::model::DecoderModel m = random_model(1);
  const auto before = m.layer(0).experts[0].gate;
  moesq::compress::CompressOptions opt;
  opt.method = &moesq::compress::methods::kSgptq;
  const auto r = moesq::compress::compress_model(m, calib(4, 32, 2), opt);
  ASSERT_EQ(r.reports.size(), 12u);
  for (int64_t l = 0; l < 2; ++l) {
    int64_t tokens = 0;
    for (const auto& rep : r.reports)
      if (rep.layer == l) tokens += rep.tokens;
    EXPECT_EQ(tokens, 4 * 32 * 2) << "layer " << l << ": every (token, top-k slot) cached once";
  }
  bool saw_empty = false;
  for (const auto& rep : r.reports) {
    if (rep.tokens == 0) {
      saw_empty = true;
      EXPECT_TRUE(rep.fallback) << "layer " << rep.layer << " expert " << rep.expert;
      EXPECT_FALSE(rep.note.empty());
    } else {
      EXPECT_TRUE(std::isfinite(rep.rel_error)) << "layer " << rep.layer << " expert " << rep.expert;
    }
  }
  EXPECT_TRUE(saw_empty) << "the fixture must route no token to expert 5";
  for (const auto& pe : r.experts[1])
    for (const auto& p : pe.proj)
      for (float v : p.dequantize()) ASSERT_TRUE(std::isfinite(v));
  // Installed: the model now holds the dequantized compressed weights (4:8 sparse: half zeros).
  const auto& after = m.layer(0).experts[0].gate;
  EXPECT_NE(after, before);
  int64_t zeros = 0;
  for (float v : after) zeros += v == 0.0f;
  EXPECT_GE(zeros, static_cast<int64_t>(after.size() / 2));
}

TEST(CompressPipeline, SgptqBeatsMagnitudeOnExpertOutputs) {
  double err[2] = {0, 0};
  const moesq::compress::Method* methods[2] = {&moesq::compress::methods::kMagnitude, &moesq::compress::methods::kSgptq};
  for (int i = 0; i < 2; ++i) {
    moesq::model::DecoderModel m = random_model(3);
    moesq::compress::CompressOptions opt;
    opt.method = methods[i];
    const auto r = moesq::compress::compress_model(m, calib(8, 32, 4), opt);
    // Layer 0 only: both methods see the same layer-0 inputs (later layers see compressed states).
    for (const auto& rep : r.reports)
      if (rep.layer == 0 && rep.tokens > 0) err[i] += rep.rel_error;
  }
  EXPECT_LT(err[1], 0.9 * err[0]) << "magnitude " << err[0] << " vs sgptq " << err[1];
}

// Options are validated once, before any work: a bad refinement value is reported even though the
// calibration set holds a token outside the vocabulary, which the first step (embedding, before
// layer-0 routing) would reject. Before typed options it surfaced inside an expert worker, after routing.
TEST(CompressPipeline, BadOptionFailsBeforeAnyWork) {
  moesq::model::DecoderModel m = random_model(5);
  moesq::compress::CalibSet c = calib(2, 8, 6);
  c.sequences[0][0] = 1000;  // outside the vocabulary of 64
  moesq::compress::CompressOptions opt;
  opt.method = &moesq::compress::methods::kMoesq;
  opt.refine.tau0 = -1.0;
  try {
    moesq::compress::compress_model(m, c, opt);
    FAIL() << "no error";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("τ0"), std::string::npos) << e.what();
  }
  opt.refine.tau0 = 2.0;
  opt.threads = -1;
  EXPECT_THROW(moesq::compress::validate(opt), moesq::Error);
}

TEST(CompressPipeline, MethodNamesRoundTripAndUnknownIsAnError) {
  for (const char* n : {"rtn-nvfp4", "magnitude", "sgptq", "moesq", "jsq", "obr"})
    EXPECT_STREQ(moesq::compress::parse_method(n)->name, n);
  try {
    moesq::compress::parse_method("gptq");
    FAIL() << "no error";
  } catch (const moesq::Error& e) {
    EXPECT_STREQ(e.what(),
                 "--method: unknown method 'gptq' (expected rtn-nvfp4, magnitude, sgptq, moesq, jsq or obr)");
  }
}

}  // namespace

// RefineOptions::original_targets (`--targets original`): the refinement's targets come from a second,
// uncompressed calibration stream. Layer 1's inputs are the same in both streams, so its experts come
// out bit for bit as with the default targets; layer 2's inputs drift in the compressed stream only,
// so its targets (and experts) change, while its reconstruction error stays measured on the same
// inputs (finite, comparable). The option is CPU-only for now: a device factory is refused up front.
TEST(CompressPipeline, OriginalTargetsChangeOnlyLayersAfterTheFirst) {
  moesq::compress::CompressOptions opt;
  opt.method = &moesq::compress::methods::kMoesq;
  opt.refine.epochs = 1;
  opt.refine.batch = 32;
  opt.threads = 2;
  std::vector<moesq::compress::CompressResult> r;
  for (bool original : {false, true}) {
    moesq::model::DecoderModel m = random_model(5);
    opt.refine.original_targets = original;
    r.push_back(moesq::compress::compress_model(m, calib(6, 32, 6), opt));
  }
  int64_t layer1_differs = 0;
  for (int64_t l = 0; l < 2; ++l)
    for (size_t e = 0; e < 6; ++e)
      for (int p = 0; p < 3; ++p) {
        const bool same = r[0].experts[static_cast<size_t>(l)][e].proj[static_cast<size_t>(p)].dequantize() ==
                          r[1].experts[static_cast<size_t>(l)][e].proj[static_cast<size_t>(p)].dequantize();
        if (l == 0) EXPECT_TRUE(same) << "layer 1 expert " << e << " projection " << p;
        else layer1_differs += !same;
      }
  EXPECT_GT(layer1_differs, 0) << "layer 2's targets must come from the original stream";
  for (const auto& rep : r[1].reports)
    if (rep.tokens > 0) EXPECT_TRUE(std::isfinite(rep.rel_error)) << "layer " << rep.layer << " expert " << rep.expert;
  moesq::compress::CompressOptions gpu = opt;
  gpu.refine.device = [] { return std::unique_ptr<moesq::compress::refine::StepBackend>(); };
  try {
    moesq::compress::validate(gpu);
    FAIL() << "--targets original with a device must be refused";
  } catch (const moesq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--targets original"), std::string::npos) << e.what();
  }
}
