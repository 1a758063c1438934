// percentile / summarize against numpy.percentile's linear method, worked by hand.
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "serve/latency_stats.h"

using namespace moesq::serve;

TEST(LatencyStats, PercentileIsNumpysLinearMethod) {
  // numpy.percentile([3, 1, 4, 1, 5], q): sorted 1 1 3 4 5, h = 4·q/100.
  const std::vector<double> x = {3, 1, 4, 1, 5};
  EXPECT_DOUBLE_EQ(percentile(x, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(x, 50), 3.0);
  EXPECT_DOUBLE_EQ(percentile(x, 99), 4.96);  // h = 3.96: 4 + 0.96·(5 − 4)
  EXPECT_DOUBLE_EQ(percentile(x, 100), 5.0);
  EXPECT_DOUBLE_EQ(percentile(x, 30), 1.4);   // h = 1.2: 1 + 0.2·(3 − 1)
  EXPECT_DOUBLE_EQ(percentile({2.5}, 99), 2.5);
  EXPECT_THROW(percentile({}, 50), moesq::Error);
  EXPECT_THROW(percentile(x, 101), moesq::Error);
}

TEST(LatencyStats, Summary) {
  const LatencySummary s = summarize({10, 20, 30, 40});
  EXPECT_EQ(s.count, 4);
  EXPECT_DOUBLE_EQ(s.mean, 25);
  EXPECT_DOUBLE_EQ(s.median, 25);
  EXPECT_DOUBLE_EQ(s.p99, 39.7);  // h = 2.97
  EXPECT_DOUBLE_EQ(s.min, 10);
  EXPECT_DOUBLE_EQ(s.max, 40);
  const LatencySummary e = summarize({});
  EXPECT_EQ(e.count, 0);
  EXPECT_EQ(e.mean, 0);
}
