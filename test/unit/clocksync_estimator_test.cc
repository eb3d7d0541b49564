// Offset/drift estimation on synthetic one-way delays with known truth.
// Each statistical test runs many seeds and asserts on the distribution, the
// way clock code has to be tested: one lucky run proves nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
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

// The live feed: forward samples arrive a pair or two late (they come back in
// the peer's feedback), and whole windows lack one direction (pairs rejected
// by the pair filter, congestion). Steps every `every_s` of `step_ns` in the
// peer's clock (or ours: `local` shifts our stamps too).
struct StepRun {
  uint64_t steps_true = 0, steps_seen = 0;
  double within = 0;        // fraction of valid estimates within their bound
  double valid = 0;         // fraction of the time a model is reported
  double reconverge_max_s = 0, reconverge_sum_s = 0;
  std::vector<double> err;  // |error| of valid estimates
};

StepRun run_steps(uint64_t seed, double step_ns, double every_s, bool local, double seconds = 60) {
  sim::Scenario sc;
  sim::Link link(sc, seed);
  OffsetEstimator est;
  StepRun out;
  auto steps_at = [&](int64_t t) { return std::floor(double(t - sc.t_start) * 1e-9 / every_s); };
  std::uniform_real_distribution<> u(0, 1);
  std::deque<std::pair<int64_t, Sample>> late;  // forward samples in flight: (deliver at, sample)
  int64_t win = 500'000'000;
  int64_t miss_win = -1;
  int miss_dir = -1;
  int valid_n = 0, total_n = 0, within_n = 0;
  double last_step_t = -1;
  bool waiting = false;
  for (int64_t t = sc.t_start; t < sc.t_start + int64_t(seconds * 1e9); t += sc.interval_ns) {
    int64_t w = (t - sc.t_start) / win;
    if (w != miss_win) {  // a new window: maybe one direction has nothing in it
      miss_win = w;
      double x = u(link.rng());
      miss_dir = x < 0.35 ? 0 : x < 0.5 ? 1 : -1;
    }
    // A step in the peer's clock raises theta; a step in ours lowers it, and
    // shifts our own stamps (the sample times) too.
    double k = steps_at(t);
    double th_step = local ? -step_ns * k : step_ns * k;
    int64_t tshift = local ? int64_t(step_ns * k) : 0;
    int64_t tf = t;
    if (miss_dir != 0 && u(link.rng()) < 0.8)
      late.push_back({t + sc.interval_ns * (1 + int64_t(u(link.rng()) * 2)),
                      Sample{tf + tshift, link.forward(tf) + int64_t(th_step)}});
    int64_t tr = t + sc.interval_ns / 2;
    if (miss_dir != 1 && u(link.rng()) < 0.8)
      est.add_reverse({tr + tshift, link.reverse(tr) - int64_t(th_step)});
    while (!late.empty() && late.front().first <= tr) {
      est.add_forward(late.front().second);
      late.pop_front();
    }
    est.tick(tr + tshift);
    if (getenv("CS_DEBUG") && est.steps_detected() != out.steps_seen) {
      out.steps_seen = est.steps_detected();
      printf("seed %lu: step seen at %.2f s\n", (unsigned long)seed, double(t - sc.t_start) * 1e-9);
    }
    if (k >= 1 && double(k) * every_s != last_step_t) {
      last_step_t = double(k) * every_s;
      out.steps_true++;
      waiting = true;
    }
    if (t - sc.t_start < int64_t(3e9)) continue;
    const ClockModel& m = est.model();
    double truth = link.theta(tr) + th_step;
    total_n++;
    if (!m.valid) continue;
    valid_n++;
    double e = std::fabs(m.offset_at(tr + tshift) - truth);
    out.err.push_back(e);
    bool ok = e <= m.bound_at(tr + tshift);
    within_n += ok;
    if (waiting && ok) {
      double dt = double(t - sc.t_start) * 1e-9 - last_step_t;
      out.reconverge_max_s = std::max(out.reconverge_max_s, dt);
      out.reconverge_sum_s += dt;
      waiting = false;
    }
  }
  out.steps_seen = est.steps_detected();
  out.within = double(within_n) / std::max(1, valid_n);
  out.valid = double(valid_n) / std::max(1, total_n);
  return out;
}

TEST(ClocksyncEstimator, TracksRepeatedStepsWhenWindowsLackOneDirection) {
  // The live failure: 60 us every 9 s, forward samples late, windows often
  // missing one direction. Both signs, in the peer's clock and in ours.
  for (bool local : {false, true}) {
    for (double step : {60'000.0, -60'000.0}) {
      std::vector<double> err;
      double within_min = 1, valid_min = 1, rec_max = 0, rec_sum = 0;
      uint64_t n_steps = 0;
      for (int s = 0; s < 20; s++) {
        StepRun r = run_steps(500 + s, step, 9, local);
        EXPECT_EQ(r.steps_seen, r.steps_true) << "seed " << s << " step " << step << " local " << local;
        err.insert(err.end(), r.err.begin(), r.err.end());
        within_min = std::min(within_min, r.within);
        valid_min = std::min(valid_min, r.valid);
        rec_max = std::max(rec_max, r.reconverge_max_s);
        rec_sum += r.reconverge_sum_s;
        n_steps += r.steps_true;
      }
      if (getenv("CS_VERBOSE"))
        printf("step %.0f local %d: |err| p50 %.0f p99 %.0f ns, within >= %.3f, valid >= %.3f, "
               "reconverge mean %.2f max %.2f s\n", step, local, quantile(err, 0.5), quantile(err, 0.99),
               within_min, valid_min, rec_sum / double(n_steps), rec_max);
      // Until a clean sample arrives in the direction that can show the step
      // (below the envelope), it looks like queueing: the few estimates in
      // that gap are off by the step.
      EXPECT_GE(within_min, 0.96) << step << " " << local;
      EXPECT_GE(valid_min, 0.85) << step << " " << local;
      EXPECT_LT(rec_sum / double(n_steps), 1.0) << step << " " << local;
      EXPECT_LT(rec_max, 4) << step << " " << local;
      EXPECT_LT(quantile(err, 0.95), 1000) << step << " " << local;
    }
  }
}

TEST(ClocksyncEstimator, LoneSampleBelowEnvelopeIsAGlitchNotAStep) {
  sim::Scenario sc;
  sim::Link link(sc, 9);
  OffsetEstimator est;
  int64_t t = sc.t_start;
  for (int i = 0; i < 150; i++, t += sc.interval_ns) {
    est.add_forward({t, link.forward(t)});
    int64_t tr = t + sc.interval_ns / 2;
    // One reverse sample 100 us too early (a bad stamp), at 10 s.
    est.add_reverse({tr, link.reverse(tr) - (i == 100 ? 100'000 : 0)});
    est.tick(tr);
    if (i == 100) {
      EXPECT_FALSE(est.model().valid);  // suspect until the next sample
    }
  }
  ASSERT_TRUE(est.model().valid);
  EXPECT_EQ(est.steps_detected(), 0u);
  EXPECT_EQ(est.glitches(), 1u);
  EXPECT_LT(std::fabs(est.model().offset_at(t) - link.theta(t)), 300);
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
