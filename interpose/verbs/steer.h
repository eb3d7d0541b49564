// Steering a split bundle's shares by each path's forward queue (the probe
// engine's one-way delays over the path's base, clocksync/congestion.h).
// Pure arithmetic over the shares, so it is tested without a fabric.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <random>
#include <utility>
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

// Steering a pinned bundle (SHUNT_SPREAD=pin with SHUNT_STEER=queue): its
// work stays on one path, the carrier, and moves whole to another path
// when that clears a congested queue (two jobs whose QPs share a spine
// while the other idles). Where every path queues (each job fills its own
// spine) nothing moves: a busy spine is no better. A path has a half at
// each end, each with its own source port and so its own spine; each end
// judges its own direction (the forward queues its host agent measures on
// its halves' source ports, where a half on its carrier's spine queues with
// the carrier's own traffic: the same spine, no worse), and the other
// side tells the deciding side its verdicts.
// One direction of a path (one end's half): the probes' verdict on its
// forward queue (-1 not known, 0 clear, 1 congested over the path's noise
// threshold), the queue itself and that threshold, and whether the half
// crosses the router the carrier's half in that direction crosses; and
// the highest queue the half showed over the last kCarrierEchoMs (QueueEcho;
// -1 not kept).
struct CarrierDir {
  int verdict = -1;
  double excess_ns = 0;
  double threshold_ns = 0;
  bool same = false;
  double recent_ns = -1;
};

struct CarrierView {
  int path = -1;       // the bundle's path index (the application's QP: kPrimary)
  bool usable = true;  // up and off probation
  CarrierDir own;      // our direction
  CarrierDir peer;     // the peer's, as it told the deciding side (verdict -1 where it told nothing)
};

// The probes' verdicts alone are too fine for this: their thresholds come
// from an idle fabric, and on loaded soft-RoCE guests every path is
// "congested": a spine that carries nothing of the job's shows 0.6-11 ms,
// the spine two jobs share 45-250 ms, a spine one job fills alone 90-130
// ms (where the spines are slower than the NICs a job fills its own
// spine's queue; on a fabric as fast as its NICs only shared links queue).
// So, per direction, against the carrier's half in it:
// - the carrier is congested there when the probes say so and its queue is
//   at least kCarrierQueueNoise thresholds (on an idle fabric one moved at
//   0.5 ms);
// - a path clears it when its queue is under 1/kCarrierClearRatio of the
//   carrier's and under the larger of kCarrierClearNoise thresholds and
//   kCarrierClearFloorNs (a job alone at 98 ms once moved onto the other
//   job's spine, whose window-limited flow showed 16 ms);
// - a path is no worse there when it is clear by its probes, on the
//   carrier's router, under twice the carrier's queue or under that floor.
//   A direction nothing is known of (the peer told nothing) does not object.
// - a path is no target while, in a direction the carrier is congested,
//   its queue rose to kCarrierEchoShare of the carrier's within the last
//   kCarrierEchoMs: a queue that every path shows within a second or two
//   is the host's (a guest whose CPU stalls delays every path's probes, in
//   turn; fabric test 61 once moved at 25.7 ms against 2.6 before any
//   fault, with every path at 14-25 ms within the same second), not the
//   carrier's spine, where the other spine stays clear throughout.
// The target must clear a congested direction and be no worse in either;
// where both directions queue, a path that clears both wins over one that
// clears one (fabric test 61 once moved to a path that cleared the peer's
// direction and kept its own on the slowed spine). Among several, a random one (bundles of two jobs on the same spine
// should not both pick the same free path every time).
int carrier_target(const CarrierView& carrier, const std::vector<CarrierView>& others, std::mt19937& rng);
bool carrier_congested(const CarrierDir& c);
constexpr double kCarrierQueueNoise = 10;
constexpr double kCarrierClearRatio = 8;
constexpr double kCarrierClearNoise = 3;
constexpr double kCarrierClearFloorNs = 20e6;
constexpr double kCarrierEchoShare = 0.5;
constexpr int64_t kCarrierEchoMs = 3000;

// The highest queue each path showed each way over the last kCarrierEchoMs,
// fed every steering round (CarrierDir::recent_ns).
class QueueEcho {
 public:
  // Notes `d`'s queue for `path` in direction `dir` (0 ours, 1 the peer's)
  // at now_ms (nothing where its verdict is not known) and returns the
  // highest noted in the window (-1 none).
  double note(int64_t now_ms, int path, int dir, const CarrierDir& d);

 private:
  std::map<std::pair<int, int>, std::deque<std::pair<int64_t, double>>> seen_;
};

// The hold before a move: the carrier must stay congested with a clear
// path for a random time in [kCarrierHoldMinMs, max) (so of two jobs that
// met on one spine, one moves first, and the other's probes see the spine
// it would take fill before its own hold ends). max starts at
// kCarrierHoldMaxMs and doubles, to kCarrierHoldCapMs, with each move that
// follows the last within kCarrierCalmMs: two jobs that moved together
// and met again draw from ever wider windows, as Ethernet's backoff does.
// After a move the bundle stays for at least kCarrierDwellMs: a move costs
// a drain, and the queues need a few probe rounds to show where the work
// went.
constexpr int64_t kCarrierHoldMinMs = 1000;
constexpr int64_t kCarrierHoldMaxMs = 4000;
constexpr int64_t kCarrierHoldCapMs = 32000;
constexpr int64_t kCarrierCalmMs = 30000;
constexpr int64_t kCarrierDwellMs = 3000;
// The condition may lapse for up to this long without the hold starting
// over: the queues of a job's own bursts come and go, and two bundles that
// see the same probes would otherwise start their holds together after
// every lapse (their draws then decide less than the lapses).
constexpr int64_t kCarrierLapseMs = 1500;

// That timing, per bundle: tick() with carrier_target's answer every
// steering round returns the path to move to once the hold has passed
// (the answer of that round, which may differ from the first), else -1.
class CarrierHold {
 public:
  int tick(int64_t now_ms, int target, std::mt19937& rng);
  void moved(int64_t now_ms);
  bool holding() const { return since_ != 0; }
  int64_t window_ms() const { return max_; }

 private:
  int64_t since_ = 0, wait_ = 0, after_ = 0, last_move_ = 0, max_ = kCarrierHoldMaxMs, last_seen_ = 0;
};

constexpr double kSteerGain = 0.2;
constexpr double kTrendNs = 250e6;
constexpr double kMaxStep = 0.3;
// In the model of test/unit/steer_test.cc, over 50 seeds: without this
// term no seed evens out short standing queues; 0.07 is too slow for some
// (10 s); 0.1 to 0.14 pass every test; 0.2 swings the open-loop jobs in 15.
constexpr double kLevelGain = 0.12;

}  // namespace shunt::verbs
