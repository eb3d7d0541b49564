// Offset/drift estimation on synthetic one-way delays with known truth.
// Each statistical test runs many seeds and asserts on the distribution, the
// way clock code has to be tested: one lucky run proves nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "clocksync/estimator.h"
#include "test/unit/clocksync_sim.h"

namespace shunt::clocksync {
namespace {

struct SimRun {
  double err_ns;    // estimate minus truth at the end
  double bound_ns;
  double drift_err_ppb;
  double converge_s;  // first time the model was valid and within its bound
  OffsetEstimator est;
};

// Feeds `seconds` of probes (one each way per interval) and evaluates at the end.
SimRun run(const sim::Scenario& sc, uint64_t seed, double seconds, const EstimatorParams& p = {}) {
  sim::Link link(sc, seed);
  SimRun r{0, 0, 0, -1, OffsetEstimator(p)};
  int64_t t = sc.t_start;
  int64_t end = sc.t_start + int64_t(seconds * 1e9);
  std::uniform_int_distribution<int64_t> jit(0, sc.interval_ns / 10);
  for (; t < end; t += sc.interval_ns) {
    int64_t tf = t + jit(link.rng());
    r.est.add_forward({tf, link.forward(tf)});
    int64_t tr = t + sc.interval_ns / 2 + jit(link.rng());
    r.est.add_reverse({tr, link.reverse(tr)});
    r.est.tick(t + sc.interval_ns / 2);
    const ClockModel& m = r.est.model();
    if (r.converge_s < 0 && m.valid &&
        std::fabs(m.offset_at(t) - link.theta(t)) <= m.bound_at(t))
      r.converge_s = double(t - sc.t_start) * 1e-9;
  }
  const ClockModel& m = r.est.model();
  r.err_ns = m.offset_at(t) - link.theta(t);
  r.bound_ns = m.bound_at(t);
  r.drift_err_ppb = (m.drift - sc.drift) * 1e9;
  return r;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[size_t(q * double(v.size() - 1))];
}

struct Stats {
  double p50, p99, max, within_bound, drift_p99_ppb, converge_max_s;
};

Stats many(const sim::Scenario& sc, int seeds, double seconds) {
  std::vector<double> err, derr;
  int within = 0;
  double conv = 0;
  for (int s = 0; s < seeds; s++) {
    SimRun r = run(sc, 1000 + s, seconds);
    EXPECT_TRUE(r.est.model().valid);
    err.push_back(std::fabs(r.err_ns));
    derr.push_back(std::fabs(r.drift_err_ppb));
    within += std::fabs(r.err_ns) <= r.bound_ns;
    conv = std::max(conv, r.converge_s);
  }
  if (getenv("CS_VERBOSE")) printf("p50 %.1f p99 %.1f max %.1f within %.2f drift_p99 %.2f ppb conv %.1f s\n", quantile(err, 0.5), quantile(err, 0.99), *std::max_element(err.begin(), err.end()), double(within) / seeds, quantile(derr, 0.99), conv);
  return {quantile(err, 0.5), quantile(err, 0.99), *std::max_element(err.begin(), err.end()),
          double(within) / seeds, quantile(derr, 0.99), conv};
}

TEST(ClocksyncEnvelopeFit, RecoversLineExactlyWithoutNoise) {
  std::deque<std::pair<double, double>> up, lo;
  for (int i = 0; i < 10; i++) {
    double t = i * 1e8;
    up.emplace_back(t, 500 + 3e-5 * t + 1000);   // theta + D
    lo.emplace_back(t + 5e7, 500 + 3e-5 * (t + 5e7) - 1000);
  }
  EnvelopeFit f;
  ASSERT_TRUE(fit_envelope(up, lo, &f));
  EXPECT_NEAR(f.a, 500, 1e-3);
  EXPECT_NEAR(f.b, 3e-5, 1e-12);
  EXPECT_NEAR(f.half_gap, 1000, 1e-3);
}

TEST(ClocksyncEnvelopeFit, RefusesUndeterminedSlope) {
  std::deque<std::pair<double, double>> up{{0, 10}}, lo{{1e8, -10}};
  EnvelopeFit f;
  EXPECT_FALSE(fit_envelope(up, lo, &f));
}

TEST(ClocksyncEstimator, ConvergesWithDriftAndExponentialQueueing) {
  for (double drift : {100e-6, -100e-6, 0.0, 37e-6}) {
    sim::Scenario sc;
    sc.drift = drift;
    Stats s = many(sc, 60, 20);
    EXPECT_LT(s.p99, 300) << "drift " << drift;
    EXPECT_GE(s.within_bound, 0.95) << "drift " << drift;
    EXPECT_LT(s.drift_p99_ppb, 50) << "drift " << drift;
    EXPECT_LT(s.converge_max_s, 5) << "drift " << drift;
  }
}

TEST(ClocksyncEstimator, BurstyOneSidedQueueingKeepsErrorSmall) {
  sim::Scenario sc;
  sc.burst_mean_ns = 50'000;  // 50 us mean extra queueing, forward only, half the time
  Stats s = many(sc, 60, 20);
  EXPECT_LT(s.p99, 500);
  EXPECT_GE(s.within_bound, 0.95);
}

TEST(ClocksyncEstimator, FixedAsymmetryBiasesByItsSizeButStaysWithinHalfRtt) {
  sim::Scenario sc;
  sc.asym_ns = 2'000;
  SimRun r = run(sc, 7, 20);
  ASSERT_TRUE(r.est.model().valid);
  EXPECT_NEAR(r.err_ns, 2'000, 300);  // invisible to any two-way method
  EXPECT_LT(std::fabs(r.err_ns), r.est.model().half_rtt_ns);
}

TEST(ClocksyncEstimator, FollowsWander) {
  sim::Scenario sc;
  sc.wander_ns = 300;
  sc.wander_period_s = 60;
  Stats s = many(sc, 40, 30);
  EXPECT_LT(s.p99, 400);
}

TEST(ClocksyncEstimator, DetectsStepAndReconverges) {
  sim::Scenario sc;
  sim::Link link(sc, 3);
  OffsetEstimator est;
  int64_t t = sc.t_start;
  const double step = 200'000;
  for (int i = 0; i < 250; i++, t += sc.interval_ns) {
    double extra = i >= 100 ? step : 0;  // peer clock steps at 10 s
    est.add_forward({t, link.forward(t) + int64_t(extra)});
    int64_t tr = t + sc.interval_ns / 2;
    est.add_reverse({tr, link.reverse(tr) - int64_t(extra)});
    est.tick(tr);
  }
  ASSERT_TRUE(est.model().valid);
  EXPECT_EQ(est.steps_detected(), 1u);
  EXPECT_LT(std::fabs(est.model().offset_at(t) - (link.theta(t) + step)), 500);
}

TEST(ClocksyncEstimator, HoldoverBoundCoversExtrapolation) {
  int within = 0, n = 40;
  std::vector<double> errs;
  for (int s = 0; s < n; s++) {
    sim::Scenario sc;
    sc.wander_ns = 200;
    sc.wander_period_s = 120;
    SimRun r = run(sc, 50 + s, 20);
    sim::Link link(sc, 0);
    int64_t later = sc.t_start + int64_t(30e9);  // 10 s without probes
    double err = std::fabs(r.est.model().offset_at(later) - link.theta(later));
    errs.push_back(err);
    within += err <= r.est.model().bound_at(later);
  }
  EXPECT_GE(within, n * 95 / 100);
  EXPECT_LT(quantile(errs, 0.5), 1000);
}

TEST(ClocksyncEstimator, NoModelFromOneDirectionOnly) {
  sim::Scenario sc;
  sim::Link link(sc, 1);
  OffsetEstimator est;
  for (int64_t t = sc.t_start; t < sc.t_start + int64_t(10e9); t += sc.interval_ns) {
    est.add_forward({t, link.forward(t)});
    est.tick(t);
  }
  EXPECT_FALSE(est.model().valid);
}

}  // namespace
}  // namespace shunt::clocksync
