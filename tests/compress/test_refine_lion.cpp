// Lion step and the refinement schedules (refine/lion.h): the update rule term by term, fast vs
// reference step, convergence on a quadratic, schedule endpoints/monotonicity and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "compress/refine/lion.h"
#include "core/error.h"

using namespace moesq::compress::refine;

namespace {
// fp32 update θ − lr·sign(c) − lr·λ·θ vs its double restatement: two roundings of O(|θ|) values.
constexpr float kStepUlps = 4.0f;
}  // namespace

TEST(RefineLion, StepFollowsTheUpdateRule) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 1000;
  std::vector<float> theta(n), m(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    theta[i] = nd(rng);
    m[i] = nd(rng);
    g[i] = nd(rng);
  }
  g[0] = 0.0f;  // sign(0) = 0: only weight decay moves θ when c == 0
  m[0] = 0.0f;
  const LionConfig cfg{0.9, 0.95, 0.3};
  const double lr = 1e-2;
  std::vector<float> t2 = theta, m2 = m;
  lion_step(t2.data(), m2.data(), g.data(), n, lr, cfg);
  int64_t plus = 0, minus = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double c = cfg.beta1 * m[i] + (1 - cfg.beta1) * g[i];
    const double sgn = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
    plus += sgn > 0;
    minus += sgn < 0;
    const double want = theta[i] - lr * sgn - lr * cfg.weight_decay * theta[i];
    EXPECT_NEAR(t2[i], want, kStepUlps * 1.2e-7 * (std::fabs(want) + 1)) << "element " << i;
    const double want_m = cfg.beta2 * m[i] + (1 - cfg.beta2) * g[i];
    EXPECT_NEAR(m2[i], want_m, kStepUlps * 1.2e-7 * (std::fabs(want_m) + 1)) << "element " << i;
  }
  EXPECT_NEAR(t2[0], theta[0] * (1 - lr * cfg.weight_decay), 1e-6);
  EXPECT_GT(plus, n / 4);  // both signs occur: the test cannot pass with a constant update
  EXPECT_GT(minus, n / 4);
}

TEST(RefineLion, FastMatchesReference) {
  std::mt19937_64 rng(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 4096;
  std::vector<float> t1(n), m1(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    t1[i] = nd(rng);
    m1[i] = nd(rng);
    g[i] = nd(rng);
  }
  std::vector<float> t2 = t1, m2 = m1;
  const LionConfig cfg{0.9, 0.95, 1.0};
  lion_step(t1.data(), m1.data(), g.data(), n, 2.5e-4, cfg);
  lion_step_ref(t2.data(), m2.data(), g.data(), n, 2.5e-4, cfg);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(t1[i], t2[i], kStepUlps * 1.2e-7 * (std::fabs(t2[i]) + 1)) << "element " << i;
    EXPECT_NEAR(m1[i], m2[i], kStepUlps * 1.2e-7 * (std::fabs(m2[i]) + 1)) << "element " << i;
  }
}

TEST(RefineLion, MinimizesAQuadratic) {
  // f(θ) = ½‖θ − θ*‖²; with cosine decay to 0.1·lr Lion ends within a few final steps of θ*.
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 256, steps = 2000;
  std::vector<float> theta(n, 0.0f), target(n), m(n, 0.0f), g(n);
  for (auto& t : target) t = nd(rng);
  const LionConfig cfg{0.9, 0.95, 0.0};
  const double lr0 = 1e-2;
  double err0 = 0;
  for (int64_t i = 0; i < n; ++i) err0 = std::max(err0, std::fabs(double(target[i])));
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t i = 0; i < n; ++i) g[i] = theta[i] - target[i];
    lion_step(theta.data(), m.data(), g.data(), n, cosine_lr(lr0, 0.1, s, steps), cfg);
  }
  double err = 0;
  for (int64_t i = 0; i < n; ++i) err = std::max(err, std::fabs(double(theta[i] - target[i])));
  EXPECT_LT(err, 10 * 0.1 * lr0) << "start max error " << err0;  // a few steps of the final lr
}

TEST(RefineLion, Schedules) {
  const int64_t T = 50;
  EXPECT_DOUBLE_EQ(cosine_lr(2.5e-4, 0.1, 0, T), 2.5e-4);
  EXPECT_NEAR(cosine_lr(2.5e-4, 0.1, T - 1, T), 2.5e-5, 1e-18);
  EXPECT_NEAR(cosine_lr(1.0, 0.1, (T - 1) / 2, T), 0.55, 0.02);  // midpoint of the cosine
  for (int64_t s = 1; s < T; ++s) EXPECT_LT(cosine_lr(1.0, 0.1, s, T), cosine_lr(1.0, 0.1, s - 1, T));
  EXPECT_DOUBLE_EQ(linear_schedule(2.0, 0.05, 0, T), 2.0);
  EXPECT_DOUBLE_EQ(linear_schedule(2.0, 0.05, T - 1, T), 0.05);
  EXPECT_DOUBLE_EQ(linear_schedule(100, 500, 0, 1), 100);  // one step: the start value
  EXPECT_NEAR(linear_schedule(100, 500, 10, 21), 300, 1e-9);
  EXPECT_THROW(cosine_lr(1.0, 0.1, T, T), moesq::Error);
  EXPECT_THROW(linear_schedule(1.0, 0.1, -1, T), moesq::Error);
  EXPECT_THROW(linear_schedule(1.0, 0.1, 0, 0), moesq::Error);
}
