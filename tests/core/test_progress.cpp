// Durations and ETAs as progress lines print them (core/progress.h): units switch at a minute and an
// hour, the ETA is the time left at the rate so far, and there is no ETA without a rate or when done.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/progress.h"

namespace {

TEST(CoreProgress, DurationTextSwitchesUnitsAtAMinuteAndAnHour) {
  EXPECT_EQ(moesq::duration_text(0.0), "0.0 s");
  EXPECT_EQ(moesq::duration_text(8.44), "8.4 s");
  EXPECT_EQ(moesq::duration_text(59.9), "59.9 s");
  EXPECT_EQ(moesq::duration_text(60.0), "1 min 00 s");
  EXPECT_EQ(moesq::duration_text(245.0), "4 min 05 s");
  EXPECT_EQ(moesq::duration_text(3599.0), "59 min 59 s");
  EXPECT_EQ(moesq::duration_text(3600.0), "1 h 00 min");
  EXPECT_EQ(moesq::duration_text(7380.0), "2 h 03 min");
  EXPECT_EQ(moesq::duration_text(-1.0), "?");
  EXPECT_EQ(moesq::duration_text(std::numeric_limits<double>::infinity()), "?");
  EXPECT_EQ(moesq::duration_text(std::nan("")), "?");
}

TEST(CoreProgress, EtaIsTheTimeLeftAtTheRateSoFar) {
  EXPECT_EQ(moesq::eta_text(10.0, 1.0, 4.0), "ETA 30.0 s");        // 10 s per unit, 3 left
  EXPECT_EQ(moesq::eta_text(80.5, 1.0, 48.0), "ETA 1 h 03 min");   // 47 × 80.5 s = 3,783.5 s
  EXPECT_EQ(moesq::eta_text(5.0, 0.0, 4.0), "");                   // no rate yet
  EXPECT_EQ(moesq::eta_text(5.0, 4.0, 4.0), "");                   // done
}

}  // namespace
