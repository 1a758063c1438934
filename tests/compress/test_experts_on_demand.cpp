// Experts on demand (model::LoadOptions::experts_on_demand, what `moesq compress` loads with): a model
// that reads each MoE layer's routed experts when compress_model reaches it and frees them after
// compresses to exactly the bits of a model loaded whole, holds no layer's experts on return, and a
// forward through a released layer is an Error naming the layer (never a read of freed memory).
#include <gtest/gtest.h>

#include <cmath>

#include "compress/calib.h"
#include "compress/pipeline.h"
#include "io/checkpoint.h"
#include "model/decoder.h"
#include "support/expect_error.h"

namespace {

moesq::compress::CalibSet small_calib(const moesq::model::DecoderModel& m) {
  // 6 sequences of 24 tokens sampled from the model (seeded): enough rows for every method's path.
  return moesq::compress::calib_from_model(m, 6, 24, 3);
}

TEST(ExpertsOnDemand, LoadsNothingUpFrontAndLayerByLayerWhenAsked) {
  const moesq::io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  moesq::model::DecoderModel lazy(ckpt, {.experts_on_demand = true});
  const moesq::model::DecoderModel whole(ckpt);
  ASSERT_TRUE(lazy.experts_on_demand());
  EXPECT_FALSE(whole.experts_on_demand());
  const int64_t L = lazy.spec().num_layers;
  for (int64_t l = 0; l < L; ++l) EXPECT_FALSE(lazy.experts_loaded(l)) << "layer " << l;
  lazy.load_experts(1);
  EXPECT_TRUE(lazy.experts_loaded(1));
  EXPECT_FALSE(lazy.experts_loaded(0));
  // The same fp32 values as the whole load, for every expert and projection.
  for (size_t e = 0; e < lazy.layer(1).experts.size(); ++e) {
    EXPECT_EQ(lazy.layer(1).experts[e].gate, whole.layer(1).experts[e].gate) << "expert " << e;
    EXPECT_EQ(lazy.layer(1).experts[e].up, whole.layer(1).experts[e].up) << "expert " << e;
    EXPECT_EQ(lazy.layer(1).experts[e].down, whole.layer(1).experts[e].down) << "expert " << e;
  }
  lazy.release_experts(1);
  EXPECT_FALSE(lazy.experts_loaded(1));
  std::vector<float> x(static_cast<size_t>(lazy.spec().hidden_size), 0.5f);
  EXPECT_ERROR_CONTAINING((void)lazy.expert_forward(1, 0, x.data(), 1, {}), "not loaded");
  EXPECT_ERROR_CONTAINING((void)lazy.expert_forward(1, 0, x.data(), 1, {}), "load_experts(1)");
  // A model loaded whole ignores release (its experts stay).
  moesq::model::DecoderModel whole2(ckpt);
  whole2.release_experts(0);
  EXPECT_TRUE(whole2.experts_loaded(0));
}

TEST(ExpertsOnDemand, CompressGivesTheBitsOfTheWholeModelAndFreesEveryLayer) {
  const moesq::io::Checkpoint ckpt(MOESQ_DEFAULT_MODEL);
  moesq::model::DecoderModel whole(ckpt);
  const moesq::compress::CalibSet calib = small_calib(whole);
  moesq::compress::CompressOptions opt;
  opt.method = &moesq::compress::methods::kSgptq;
  opt.threads = 2;
  const moesq::compress::CompressResult a = moesq::compress::compress_model(whole, calib, opt);
  moesq::model::DecoderModel lazy(ckpt, {.experts_on_demand = true});
  const moesq::compress::CompressResult b = moesq::compress::compress_model(lazy, calib, opt);
  ASSERT_EQ(a.experts.size(), b.experts.size());
  int64_t compared = 0;
  for (size_t l = 0; l < a.experts.size(); ++l) {
    EXPECT_FALSE(lazy.experts_loaded(static_cast<int64_t>(l))) << "layer " << l << " still loaded on return";
    ASSERT_EQ(a.experts[l].size(), b.experts[l].size());
    for (size_t e = 0; e < a.experts[l].size(); ++e)
      for (int p = 0; p < 3; ++p) {
        const auto& pa = a.experts[l][e].proj[static_cast<size_t>(p)];
        const auto& pb = b.experts[l][e].proj[static_cast<size_t>(p)];
        ASSERT_EQ(pa.dequantize(), pb.dequantize()) << "layer " << l << " expert " << e << " projection " << p;
        ++compared;
      }
  }
  EXPECT_GT(compared, 0);
  ASSERT_EQ(a.reports.size(), b.reports.size());
  for (size_t i = 0; i < a.reports.size(); ++i) {  // NaN: an expert without calibration tokens, in both
    if (std::isnan(a.reports[i].rel_error)) EXPECT_TRUE(std::isnan(b.reports[i].rel_error)) << "report " << i;
    else EXPECT_EQ(a.reports[i].rel_error, b.reports[i].rel_error) << "report " << i;
  }
}

}  // namespace
