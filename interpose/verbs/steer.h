// Steering a split bundle's shares by each path's forward queue (the probe
// engine's one-way delays over the path's base, clocksync/congestion.h).
// Pure arithmetic over the shares, so it is tested without a fabric.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace shunt::verbs {

struct SteerPath {
  double share = 1;         // in and out: the path's weight in a split's head
  bool known = false;       // the probes have a verdict on this path
  double excess_ns = 0;     // its forward queue: level over base
  double threshold_ns = 0;  // the excess its own noise allows
  bool congested = false;
  double prev_excess_ns = -1;  // in and out: the excess at the last step (-1: none)
};

struct SteerResult {
  bool moved = false;          // some share changed
  std::vector<int> from, to;   // the paths that lost share, and those that gained
};

// One steering step, interval_ns after the last. Nothing moves while no
// known path is congested: shares stay where the last step left them (a
// balance that keeps every queue short is kept, and an uncontended bundle
// keeps its static split). Else each known path's share is scaled by
// exp(-g u), u (at most kMaxStep either way) the sum of two terms:
// - its queue extrapolated kTrendNs ahead from its change since the last
//   step, over the bundle's mean of those, relative to the larger of that
//   mean, the path's threshold and one interval. For a sender that is not
//   window-limited the queue integrates the path's overload: steering on
//   the queue alone swings, its change is the overload itself, and a queue
//   worth one interval of drain is the unit, so a bundle whose queues are
//   all short does not jump.
// - kLevelGain times its present queue over the bundle's mean, relative
//   to the larger of that mean and its threshold: a window-limited sender
//   whose message waits for its slowest segment keeps a standing queue on
//   the slow paths only (15 against 1 ms, both far below an interval), and
//   the first term alone moves it by a fraction of a percent a step.
// g is kSteerGain times a random factor in [0.5, 1.5], so bundles of
// different jobs on one fabric do not all step alike and stampede onto the
// same free path. Paths within half their threshold of the mean keep their
// share (no dithering around a balance). Shares stay within 1/4..4 of
// their mean.
SteerResult steer_step(std::vector<SteerPath>& paths, double interval_ns, std::mt19937& rng);

constexpr double kSteerGain = 0.2;
constexpr double kTrendNs = 250e6;
constexpr double kMaxStep = 0.3;
// In the model of test/unit/steer_test.cc, over 50 seeds: without this
// term no seed evens out short standing queues; 0.07 is too slow for some
// (10 s); 0.1 to 0.14 pass every test; 0.2 swings the open-loop jobs in 15.
constexpr double kLevelGain = 0.12;

}  // namespace shunt::verbs
