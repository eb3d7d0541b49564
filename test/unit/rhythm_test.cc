// The step rhythm, from looks like the busy sampler's (every 12-28 ms,
// jittered) at synthetic jobs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "telemetry/rhythm.h"

namespace shunt::telemetry {
namespace {

// Feeds `seconds` of a job whose steps last step_ms (each step's length
// varied by up to +-jitter of it), communicating for comm_ms at the start
// of each; returns the estimate at the end.
StepEstimate run(double step_ms, double comm_ms, double seconds, double jitter = 0.0, unsigned seed = 1) {
  StepRhythm r;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  double step_start = 1000, this_step = step_ms;
  for (int64_t t = 1000; t < 1000 + seconds * 1000; t += 12 + static_cast<int64_t>(rng() % 17)) {
    while (t >= step_start + this_step) {
      step_start += this_step;
      this_step = step_ms * (1 + jitter * u(rng));
    }
    r.look(t, t - step_start < comm_ms);
  }
  return r.estimate();
}

TEST(StepRhythm, FindsTheStepOfARegularJob) {
  for (double step : {200.0, 500.0, 1300.0, 4000.0}) {
    StepEstimate e = run(step, step * 0.3, 20);
    EXPECT_NEAR(e.period_ms, step, step * 0.04 + 10) << step;
    EXPECT_GT(e.confidence, 0.8) << step;
    EXPECT_NEAR(e.comm_share, 0.3, 0.05) << step;
  }
}

TEST(StepRhythm, ASlowerStepShowsAsALongerPeriod) {
  StepEstimate before = run(500, 150, 20), after = run(700, 350, 20);
  EXPECT_NEAR(before.period_ms, 500, 30);
  EXPECT_NEAR(after.period_ms, 700, 40);
  EXPECT_GT(after.comm_share, before.comm_share);
}

TEST(StepRhythm, StepsThatVaryAreStillFound) {
  StepEstimate e = run(800, 300, 20, 0.05, 3);
  EXPECT_NEAR(e.period_ms, 800, 60);
  EXPECT_GT(e.confidence, StepRhythm::kMinConfidence);
}

// A training step's compute lasts about the same each time; its
// communication, on a starved host, does not (25-250 ms here, as the
// busy sampler timed it on one-CPU soft-RoCE guests). The step is still
// found, at the mean step time.
TEST(StepRhythm, StepsWhoseCommunicationVariesAreStillFound) {
  for (unsigned seed : {1u, 2u, 3u, 4u}) {
    StepRhythm r;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> comm(25, 250);
    double start = 1000, c = comm(rng), total = 0;
    int steps = 0;
    // The sampler's looks come late now and then: the guest's timer
    // interrupts were 5-100 ms late.
    for (int64_t t = 1000; t < 21000; t += 12 + static_cast<int64_t>(rng() % 17) + (rng() % 4 == 0 ? rng() % 100 : 0)) {
      while (t >= start + c + 400) {
        start += c + 400;
        total += c + 400;
        steps++;
        c = comm(rng);
      }
      r.look(t, t - start < c);
    }
    const double mean = total / steps;
    const StepEstimate e = r.estimate();
    EXPECT_NEAR(e.period_ms, mean, 0.1 * mean) << seed;
    EXPECT_GT(e.confidence, StepRhythm::kMinConfidence) << seed;
  }
}

TEST(StepRhythm, NoRhythmWhereThereIsNone) {
  // Communicating all the time, never, or at random: nothing reported.
  EXPECT_EQ(run(500, 500, 20).period_ms, 0);
  EXPECT_EQ(run(500, 0, 20).period_ms, 0);
  StepRhythm r;
  std::mt19937 rng(7);
  for (int64_t t = 0; t < 20000; t += 12 + rng() % 17) r.look(t, rng() % 2);
  EXPECT_EQ(r.estimate().period_ms, 0);
  EXPECT_TRUE(r.view().is_null());
  // Too little history yet.
  EXPECT_EQ(run(300, 100, 2).period_ms, 0);
}

TEST(StepRhythm, ANewRhythmTakesTheOldOnesPlace) {
  StepRhythm r;
  for (int64_t t = 0; t < 20000; t += 20) r.look(t, t % 500 < 150);
  ASSERT_NEAR(r.estimate().period_ms, 500, 30);
  // Idle for a minute (the sampler looks once a second), then a new rhythm.
  for (int64_t t = 20000; t < 80000; t += 1000) r.look(t, false);
  for (int64_t t = 80000; t < 100000; t += 20) r.look(t, t % 900 < 300);
  EXPECT_NEAR(r.estimate().period_ms, 900, 40);
  EXPECT_LE(r.estimate().span_ms, StepRhythm::kBins * StepRhythm::kBinMs);
  // Looks out of order change nothing and do not throw.
  r.look(5, true);
  EXPECT_NEAR(r.estimate().period_ms, 900, 40);
  // A gap longer than the history: it starts over.
  r.look(200000, true);
  EXPECT_EQ(r.estimate().period_ms, 0);
  EXPECT_EQ(r.estimate().span_ms, 0);
}

TEST(StepRhythm, ViewRoundsItsFigures) {
  StepRhythm r;
  for (int64_t t = 0; t < 20000; t += 20) r.look(t, t % 500 < 150);
  nlohmann::json v = r.view();
  ASSERT_TRUE(v.is_object());
  EXPECT_NEAR(v["period_ms"].get<double>(), 500, 30);
  EXPECT_NEAR(v["comm_share"].get<double>(), 0.3, 0.03);  // a look credits the 20 ms before it
}

// The sums are taken in integers with the mean removed after: the same
// autocorrelation as the plain one, in doubles, over the same smoothed bins.
TEST(StepRhythm, TheConfidenceIsThePlainAutocorrelationOfTheSmoothedSeries) {
  StepRhythm r;
  std::mt19937 rng(7);
  std::vector<double> bins;  // busy share per 20 ms bin, as the looks below fill them
  r.look(0, false);          // the history starts here
  for (int64_t b = 0; b < 900; b++) {
    // Two looks a bin (10 ms each): 0, 10 or 20 ms busy, a step of 30 bins
    // busy at its start and a little noise.
    double busy = 0;
    for (int half = 0; half < 2; half++) {
      const bool on = (b % 30 < 8) != (rng() % 10 == 0);
      r.look(b * 20 + 10 * (half + 1), on);
      busy += on ? 10 : 0;
    }
    bins.push_back(busy / 20);
  }
  const StepEstimate e = r.estimate();
  ASSERT_GT(e.period_ms, 0);
  EXPECT_NEAR(e.period_ms, 600, 20);
  // (The bin the last look opened is still empty, and left out.) The
  // series is smoothed over kSmoothBins first.
  double share = 0;
  for (double v : bins) share += v;
  share /= static_cast<double>(bins.size());
  // The smoothing the estimate took: the widest of the three that fits a
  // quarter of the step (the test's noise is rare: it wins).
  size_t w = 0;
  for (size_t cand : StepRhythm::kSmoothBins)
    if (4 * cand * StepRhythm::kBinMs <= e.period_ms + 10) w = cand;
  std::vector<double> sm;
  for (size_t i = 0; i + w <= bins.size(); i++) {
    double v = 0;
    for (size_t j = 0; j < w; j++) v += bins[i + j];
    sm.push_back(v);
  }
  const size_t n = sm.size(), k = static_cast<size_t>(std::lround(e.period_ms / StepRhythm::kBinMs));
  double mean = 0, var = 0, c = 0;
  for (double v : sm) mean += v;
  mean /= static_cast<double>(n);
  for (double v : sm) var += (v - mean) * (v - mean);
  var /= static_cast<double>(n);
  for (size_t i = 0; i + k < n; i++) c += (sm[i] - mean) * (sm[i + k] - mean);
  EXPECT_NEAR(e.confidence, std::min(1.0, c / static_cast<double>(n - k) / var), 1e-9);
  EXPECT_NEAR(e.comm_share, share, 1e-9);
}

// view() estimates again only once the looks have moved on kViewMs.
TEST(StepRhythm, ViewIsEstimatedOnceInKViewMs) {
  StepRhythm r;
  for (int64_t t = 0; t < 20000; t += 20) r.look(t, t % 500 < 150);
  const nlohmann::json first = r.view();
  ASSERT_TRUE(first.is_object());
  // Busy for the next kViewMs less 100 ms: the estimate moves, the view does not yet.
  const int64_t until = 20000 + StepRhythm::kViewMs - 100;
  for (int64_t t = 20000; t < until; t += 20) r.look(t, true);
  EXPECT_GT(r.estimate().comm_share, first["comm_share"].get<double>() + 0.01);
  EXPECT_EQ(r.view(), first);
  for (int64_t t = until; t <= until + 200; t += 20) r.look(t, true);
  const nlohmann::json later = r.view();
  ASSERT_TRUE(later.is_object());
  EXPECT_NEAR(later["comm_share"].get<double>(), r.estimate().comm_share, 0.006);
  EXPECT_NE(later, first);
}

}  // namespace
}  // namespace shunt::telemetry
