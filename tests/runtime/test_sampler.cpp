// Sampler (runtime/sampler.h): greedy = argmax with the lowest id on ties; top-p keeps the smallest
// nucleus; a fixed seed reproduces the draw; bad options are errors naming the flag.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "runtime/sampler.h"

using moesq::runtime::Sampler;
using moesq::runtime::SamplerOptions;

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s(SamplerOptions{});
  const std::vector<float> z = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.next(z.data(), 4), 1);
}

TEST(Sampler, TopPKeepsNucleusAndSeedReproduces) {
  const std::vector<float> z = {5.0f, 4.9f, -10.0f, -10.0f, -10.0f};
  SamplerOptions o;
  o.temperature = 1.0f, o.top_p = 0.9f, o.seed = 3;
  Sampler a(o), b(o);
  int seen[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < 400; ++i) {
    const int32_t x = a.next(z.data(), 5);
    EXPECT_EQ(x, b.next(z.data(), 5)) << "draw " << i;
    ++seen[x];
  }
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_EQ(seen[2] + seen[3] + seen[4], 0);  // outside the 0.9 nucleus
}

TEST(Sampler, BadOptionsAreErrors) {
  SamplerOptions o;
  o.temperature = -1.0f;
  EXPECT_THROW(Sampler{o}, moesq::Error);
  o.temperature = 1.0f, o.top_p = 0.0f;
  EXPECT_THROW(Sampler{o}, moesq::Error);
}
