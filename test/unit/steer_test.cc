// Steering of split shares (interpose/verbs/steer.h) against a model of two
// spines with queues: each spine drains `cap` per tick, its queue grows with
// what the shares put on it beyond that, and the probes see each queue two
// ticks late (the median of five samples).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <deque>
#include <random>
#include <set>

#include "interpose/verbs/steer.h"

namespace shunt::verbs {
namespace {

struct Job {
  std::vector<int> spine;  // each path's spine
  std::vector<SteerPath> paths;
  double demand;           // what the job offers per tick
  int reversals = 0;
  std::vector<int> last;   // each path's last move
};

Job job(std::vector<int> spine, double demand) {
  Job j;
  j.spine = spine;
  j.paths.resize(spine.size());
  j.last.assign(spine.size(), 0);
  j.demand = demand;
  return j;
}

// The fraction of a job's bytes on a spine.
double frac(const Job& j, int s) {
  double on = 0, all = 0;
  for (size_t i = 0; i < j.paths.size(); i++) {
    all += j.paths[i].share;
    if (j.spine[i] == s) on += j.paths[i].share;
  }
  return on / all;
}

struct Fabric {
  double cap[2];
  double q[2] = {0, 0};            // queue, in ticks of drain time
  std::deque<std::array<double, 2>> seen;  // what the probes report, late
  double cross[2] = {0, 0};        // traffic of nobody's bundle
  double load[2] = {0, 0};
  // Window-limited senders (closed loop): each spine's queue is what the
  // jobs keep in flight on it over its rate, at once; else (open loop) the
  // queue integrates the spine's overload.
  bool window = false;
  double unit_ns = 250e6;          // a queue of 1 in ns: one tick (250 ms) unless set
  // Each probe samples a queue that bursts (segments arrive 256 KiB at a
  // time): a path's reading is its spine's mean queue times an exponential
  // draw, so paths through one spine read differently at each step.
  bool bursty = false;
  // Window-limited where only the slow spine queues: the others' share of
  // the window drains at once (each message waits for its slowest segment).
  bool gated = false;
};

// One tick (a steering interval): loads from the shares, queues move, every
// job steers on what the probes saw two ticks ago.
void tick(Fabric& f, std::vector<Job>& jobs, std::mt19937& rng, bool steer = true) {
  for (int s = 0; s < 2; s++) {
    f.load[s] = f.cross[s];
    for (auto& j : jobs) f.load[s] += j.demand * frac(j, s);
    f.q[s] = f.gated    ? std::max(0.0, f.load[s] / f.cap[s] - 1)
             : f.window ? f.load[s] / f.cap[s]
                        : std::max(0.0, f.q[s] + (f.load[s] - f.cap[s]) / f.cap[s]);
  }
  f.seen.push_back({f.q[0], f.q[1]});
  if (f.seen.size() > 3) f.seen.pop_front();
  if (!steer) return;
  const auto& q = f.seen.front();
  for (auto& j : jobs) {
    for (size_t i = 0; i < j.paths.size(); i++) {
      SteerPath& p = j.paths[i];
      p.known = true;
      p.threshold_ns = 1e6;  // 1 ms of measured noise, x 6
      p.excess_ns = q[j.spine[i]] * f.unit_ns;
      if (f.bursty) p.excess_ns *= std::exponential_distribution<double>(1.0)(rng);
      p.congested = p.excess_ns > p.threshold_ns;
    }
    SteerResult r = steer_step(j.paths, 250e6, rng);
    for (int i : r.from) j.reversals += j.last[i] == 1, j.last[i] = -1;
    for (int i : r.to) j.reversals += j.last[i] == -1, j.last[i] = 1;
  }
}

// Two jobs whose ECMP placement puts 9 of 16 paths' equal shares on spine 0,
// together offering 95% of both spines' capacity, open loop (not
// window-limited): static shares overload spine 0 by 12.5% of its load
// forever; steering brings both within 5% of their mean,
// keeps them there, the queues drain, and each job's paths reverse
// direction rarely.
TEST(Steer, TwoJobsConvergeToBalancedSpines) {
  std::mt19937 rng(7);
  std::vector<Job> jobs = {job({0, 0, 0, 1, 1, 1, 1, 1}, 0.95), job({0, 0, 0, 0, 0, 0, 1, 1}, 0.95)};
  Fabric f{{1.0, 1.0}};
  tick(f, jobs, rng, false);
  EXPECT_NEAR(f.load[0], 1.06875, 1e-9);
  double worst = 0;
  for (int t = 0; t < 240; t++) {  // a minute
    tick(f, jobs, rng);
    if (t >= 120) worst = std::max(worst, std::fabs(f.load[0] - 0.95));
  }
  EXPECT_LT(worst, 0.05) << "spine 0 at " << f.load[0];
  for (auto& j : jobs) EXPECT_LT(j.reversals, 60) << "a job's paths flapped";  // < 0.5 per path per 15 s
  // Queues drained: neither spine keeps a standing queue over the threshold.
  EXPECT_LT(f.q[0] * 250e6, 4e6);
  EXPECT_LT(f.q[1] * 250e6, 4e6);
}

// The same jobs, window-limited: each keeps a fixed amount in flight, and
// a spine's queue is what sits on it over its rate. Static shares leave
// spine 0 with 9/7 of spine 1's queue; steering evens them out (the
// slowest segment decides when a message is done, so even queues are the
// most throughput), and stays there.
TEST(Steer, WindowLimitedJobsEvenOutTheirQueues) {
  std::mt19937 rng(11);
  std::vector<Job> jobs = {job({0, 0, 0, 1, 1, 1, 1, 1}, 1.0), job({0, 0, 0, 0, 0, 0, 1, 1}, 1.0)};
  Fabric f{{1.0, 1.0}};
  f.window = true;
  tick(f, jobs, rng, false);
  EXPECT_NEAR(f.q[0] / f.q[1], 9.0 / 7.0, 1e-9);
  double worst = 0;
  int reversals = 0;
  for (int t = 0; t < 240; t++) {
    tick(f, jobs, rng);
    if (t >= 120) worst = std::max(worst, std::fabs(f.q[0] / f.q[1] - 1));
  }
  for (auto& j : jobs) reversals += j.reversals;
  EXPECT_LT(worst, 0.05);
  EXPECT_LT(reversals, 120);
}

// No contention: the spines have room for everything, no queue builds, and
// the shares stay exactly equal (static spreading is never disturbed).
TEST(Steer, NoContentionNoMove) {
  std::mt19937 rng(1);
  std::vector<Job> jobs = {job({0, 0, 0, 1, 1, 1, 1, 1}, 1.0)};
  Fabric f{{1.0, 1.0}};
  for (int t = 0; t < 100; t++) tick(f, jobs, rng);
  for (auto& p : jobs[0].paths) EXPECT_DOUBLE_EQ(p.share, 1.0);
}

// A window-limited job's spines whose queues are a few ms (a queue of 1 is
// 10 ms), spine 1 slowed to slow_cap of spine 0's rate; and a job's share
// on spine 1 over its share on spine 0.
Fabric short_queues(double slow_cap) {
  Fabric f{{1.0, slow_cap}};
  f.window = true;
  f.unit_ns = 10e6;
  return f;
}
double slow_over_fast(const Job& j) { return frac(j, 1) / frac(j, 0); }

// Window-limited, as a job on soft-RoCE whose CPU limits it keeps only a
// few ms standing at the bottleneck: one spine slowed to a third of the
// other's rate, 4 of 8 paths on it. Their queues (15 against 5 ms at equal
// shares) are far below a steering interval, yet the slow paths' shares
// fall to below half of the others' within 10 s, and the queues end within
// the paths' threshold (1 ms) of each other.
TEST(Steer, ShortStandingQueuesEvenOutToo) {
  std::mt19937 rng(13);
  std::vector<Job> jobs = {job({0, 0, 0, 0, 1, 1, 1, 1}, 1.0)};
  Fabric f = short_queues(1.0 / 3);
  for (int t = 0; t < 40; t++) tick(f, jobs, rng);
  EXPECT_LT(slow_over_fast(jobs[0]), 0.5);
  for (int t = 0; t < 200; t++) tick(f, jobs, rng);
  EXPECT_LT(std::fabs(f.q[1] - f.q[0]) * f.unit_ns, 1e6)  // within the paths' threshold
      << "slow spine's queue " << f.q[1] * 10 << " ms, fast " << f.q[0] * 10;
}

// As above, but every reading is one sample of a bursty queue (a fast
// path's reading beats a slow one's a third of the time): within a minute
// the slow spine's shares are below half of the fast one's.
TEST(Steer, BurstyReadingsStillSteer) {
  std::mt19937 rng(17);
  std::vector<Job> jobs = {job({0, 0, 0, 0, 1, 1, 1, 1}, 1.0)};
  Fabric f = short_queues(1.0 / 3);
  f.bursty = true;
  double mean = 0;
  for (int t = 0; t < 240; t++) {
    tick(f, jobs, rng);
    if (t >= 120) mean += slow_over_fast(jobs[0]) / 120;
  }
  EXPECT_LT(mean, 0.5) << "the slow spine's paths kept " << mean << " of the fast one's share";
}

// Only the slow spine (a quarter of the other's rate) queues, 10 ms at
// equal shares; the fast one's queue stays under the threshold: within 20 s
// the slow spine's shares are below half of the fast one's.
TEST(Steer, OnlyTheSlowSpineQueues) {
  std::mt19937 rng(19);
  std::vector<Job> jobs = {job({0, 0, 0, 0, 1, 1, 1, 1}, 1.0)};
  Fabric f = short_queues(0.25);
  f.gated = true;
  f.bursty = true;
  for (int t = 0; t < 80; t++) tick(f, jobs, rng);
  EXPECT_LT(slow_over_fast(jobs[0]), 0.5);
}

// One slow path: cross traffic fills spine 1, on which one of four paths
// runs. Its queue makes it congested and its share falls until its spine
// carries no more than it can (the cross traffic leaves it 0.1 of capacity).
TEST(Steer, SlowPathLosesItsShare) {
  std::mt19937 rng(3);
  std::vector<Job> jobs = {job({0, 0, 0, 1}, 0.8)};
  Fabric f{{1.0, 1.0}};
  f.cross[1] = 0.9;
  for (int t = 0; t < 200; t++) tick(f, jobs, rng);
  const auto& p = jobs[0].paths;
  EXPECT_LT(p[3].share, 0.5 * p[0].share);
  EXPECT_LT(f.load[1], 1.02);
}

// Paths the probes do not know keep their share; a single known path is no
// basis for a comparison.
TEST(Steer, UnknownPathsKeepTheirShare) {
  std::mt19937 rng(5);
  std::vector<SteerPath> p(3);
  p[0].known = true, p[0].congested = true, p[0].excess_ns = 5e8, p[0].threshold_ns = 1e5;
  EXPECT_FALSE(steer_step(p, 250e6, rng).moved);
  p[1].known = true, p[1].threshold_ns = 1e5;
  SteerResult r = steer_step(p, 250e6, rng);
  ASSERT_TRUE(r.moved);
  EXPECT_LT(p[0].share, 1.0);
  EXPECT_GT(p[1].share, 1.0);
  EXPECT_NEAR(p[2].share, 1.0, 0.01);  // only the renormalization touched it
}

}  // namespace

// Steering pinned bundles (carrier_target, CarrierHold): a model of two
// jobs whose work is on one path each (the carrier), each with paths on
// both spines. A spine with a job's carrier on it queues (each job alone
// fills a spine), and the probes see a spine's state `lag_ms` late.
namespace {
// A path's view: our queue and the peer's (ms; -1: not known), each with a
// threshold of 1 ms and the probes' verdict "congested" from 3 ms on.
CarrierDir dir(double ms, bool same = false) {
  CarrierDir d;
  if (ms < 0) return d;
  d.verdict = ms >= 3 ? 1 : 0;
  d.excess_ns = ms * 1e6;
  d.threshold_ns = 1e6;
  d.same = same;
  return d;
}
CarrierView view(int path, double own, double peer, bool usable = true, bool own_same = false) {
  CarrierView v;
  v.path = path, v.usable = usable, v.own = dir(own, own_same), v.peer = dir(peer);
  return v;
}

struct PinnedJob {
  int carrier_spine = 0;
  CarrierHold hold;
  int moves = 0;
};

// Runs `ms` of the model from the given spines; returns each job's moves
// in the last `tail_ms` and whether they ended apart.
struct PinnedRun {
  int moves = 0, late_moves = 0;
  bool apart = false;
  int64_t apart_at_ms = -1;
};
PinnedRun run_pinned(int seed, int a, int b, int64_t ms, int64_t lag_ms) {
  std::mt19937 rng(seed);
  PinnedJob jobs[2];
  jobs[0].carrier_spine = a;
  jobs[1].carrier_spine = b;
  std::deque<std::pair<int64_t, std::array<int, 2>>> load;  // (when, carriers per spine)
  PinnedRun r;
  for (int64_t t = 0; t < ms; t += 250) {
    std::array<int, 2> now{0, 0};
    for (auto& j : jobs) now[j.carrier_spine]++;
    load.push_back({t, now});
    while (load.size() > 1 && load[1].first <= t - lag_ms) load.pop_front();
    const auto& seen = load.front().second;  // what the probes show now
    for (auto& j : jobs) {
      // Paths 0..3: even ones on spine 0, odd ones on spine 1. A spine a
      // job's carrier crosses queues 100 ms per carrier on it, an idle one
      // 1 ms.
      auto q = [&](int spine) { return seen[spine] ? 100.0 * seen[spine] : 1.0; };
      CarrierView c = view(100, q(j.carrier_spine), -1);
      std::vector<CarrierView> others;
      for (int p = 0; p < 4; p++) others.push_back(view(p, q(p % 2), -1, true, p % 2 == j.carrier_spine));
      int to = j.hold.tick(t, carrier_target(c, others, rng), rng);
      if (to < 0) continue;
      j.carrier_spine = to % 2;
      j.hold.moved(t);
      r.moves++;
      if (t >= ms - 20000) r.late_moves++;
    }
    bool apart = jobs[0].carrier_spine != jobs[1].carrier_spine;
    if (apart && r.apart_at_ms < 0) r.apart_at_ms = t;
    if (!apart) r.apart_at_ms = -1;
    r.apart = apart;
  }
  return r;
}
}  // namespace

TEST(CarrierSteer, MovesOnlyWhereItClearsACongestedDirectionAndWorsensNone) {
  std::mt19937 rng(1);
  // As on the soft-RoCE guests: two jobs on our spine (200 ms), the other
  // spine idle but for the loaded hosts' noise (10 ms, over its threshold).
  CarrierView c = view(-1, 200, -1);
  std::vector<CarrierView> o = {view(0, 180, -1), view(1, 10, -1), view(2, 10, -1, false), view(3, -1, -1),
                                view(4, 10, 150), view(5, 190, -1, true, true)};
  o[4].peer.threshold_ns = 1e6;
  // Congested, down, not known, on our carrier's own router (no better
  // here), and 150 ms the peer's way (it told nothing of its carrier, but
  // that queue is no place to go): path 1 only.
  std::set<int> picked;
  for (int i = 0; i < 100; i++) picked.insert(carrier_target(c, o, rng));
  EXPECT_EQ(picked, (std::set<int>{1}));
  o[4].peer = dir(2);  // calm the peer's way: path 4 too
  picked.clear();
  for (int i = 0; i < 100; i++) picked.insert(carrier_target(c, o, rng));
  EXPECT_EQ(picked, (std::set<int>{1, 4}));
  o[4].peer = dir(150);
  // The peer told of its carrier too (5 ms, calm): path 4 would take the
  // peer's direction from 5 to 150 ms.
  c.peer = dir(5);
  for (auto& x : o) if (x.peer.verdict < 0) x.peer = dir(5);
  for (int i = 0; i < 50; i++) EXPECT_EQ(carrier_target(c, o, rng), 1);
  // Nothing queues on the carrier (the probes' verdict, or under ten of its
  // thresholds: 0.5 ms on an idle fabric): stay.
  c.own = dir(0.5);
  c.own.verdict = 1;
  EXPECT_EQ(carrier_target(c, o, rng), -1);
  // The peer's direction queues, ours is calm: a path that clears the
  // peer's and is no worse in ours (path 5 is on our carrier's router).
  c.own = dir(2);
  c.peer = dir(120);
  for (auto& x : o) x.peer = dir(110);
  o[5].peer = dir(4);
  for (int i = 0; i < 50; i++) EXPECT_EQ(carrier_target(c, o, rng), 5);
  o[5].own.same = false;  // its own queue (190 ms) against our 2 ms: worse
  EXPECT_EQ(carrier_target(c, o, rng), -1);
}

TEST(CarrierSteer, AQueueEveryPathShowedInTurnIsTheHostsNotTheSpines) {
  std::mt19937 rng(5);
  QueueEcho echo;
  // A guest's CPU stalls before any fault (fabric test 61, queues in ms):
  // the other spine's path 1 first, then every path, then the carrier
  // alone, at 25.7 against path 1's 2.6.
  const double rounds[][3] = {{2.1, 21.4, 13.8}, {10.8, 24.6, 24.2}, {25.7, 4.4, 2.6}};
  CarrierView c;
  std::vector<CarrierView> o;
  int64_t t = 0;
  auto round = [&](const double* q) {
    c = view(-1, q[0], -1);
    o = {view(0, q[1], -1), view(1, q[2], -1)};
    for (auto& v : o) v.own.recent_ns = echo.note(t, v.path, 0, v.own), v.peer.recent_ns = echo.note(t, v.path, 1, v.peer);
  };
  for (const auto& q : rounds) round(q), t += 500;
  EXPECT_NEAR(o[1].own.recent_ns, 24.2e6, 1);
  EXPECT_EQ(o[1].peer.recent_ns, -1);  // nothing known that way
  EXPECT_EQ(carrier_target(c, o, rng), -1);
  // Without what path 1 showed a second ago, it clears the carrier.
  o[1].own.recent_ns = -1;
  EXPECT_EQ(carrier_target(c, o, rng), 1);
  // The spine fails later: the carrier and its spine's path 0 queue, path
  // 1 stays clear, and the stall is out of the window.
  const double fault[3] = {25, 20, 1};
  for (t = 4000; t <= 6000; t += 250) round(fault);
  EXPECT_NEAR(o[1].own.recent_ns, 1e6, 1);
  EXPECT_EQ(carrier_target(c, o, rng), 1);
  // The peer's direction too: path 1 showed the peer's queue rise with
  // the carrier's, where the carrier is congested that way only.
  c = view(-1, 1, 30);
  o = {view(1, 1, 2)};
  o[0].peer.recent_ns = echo.note(t, 1, 1, dir(16));
  o[0].peer.recent_ns = echo.note(t + 250, 1, 1, o[0].peer);
  EXPECT_EQ(carrier_target(c, o, rng), -1);
  o[0].peer.recent_ns = echo.note(t + 3300, 1, 1, o[0].peer);
  EXPECT_EQ(carrier_target(c, o, rng), 1);
}

TEST(CarrierSteer, APathThatClearsBothDirectionsWins) {
  std::mt19937 rng(4);
  // Both directions queue at the carrier; path 0 clears the peer's only
  // (ours stays on a spine as busy, under the floor), path 1 clears both.
  CarrierView c = view(-1, 15, 90);
  std::vector<CarrierView> o = {view(0, 12, 2), view(1, 1, 2), view(2, 1, 95)};
  for (int i = 0; i < 50; i++) EXPECT_EQ(carrier_target(c, o, rng), 1);
  o[1].usable = false;  // none clears both: one that clears one (path 2 is no worse the peer's way, but clears ours)
  std::set<int> picked;
  for (int i = 0; i < 100; i++) picked.insert(carrier_target(c, o, rng));
  EXPECT_EQ(picked, (std::set<int>{0, 2}));
}

TEST(CarrierSteer, BusySpinesAreNotClear) {
  std::mt19937 rng(3);
  // Apart: each job fills its own spine, the other's paths queue as much.
  CarrierView c = view(-1, 100, -1);
  std::vector<CarrierView> o = {view(0, 90, -1), view(1, 120, -1), view(2, 100, -1, true, true)};
  EXPECT_EQ(carrier_target(c, o, rng), -1);
  // A job alone fills its spine (98 ms) while the other job's spine, its
  // flow window-limited, shows 16 ms: under the 20 ms floor, but not under
  // an eighth of 98.
  c = view(-1, 98, -1);
  o = {view(0, 16, -1)};
  EXPECT_EQ(carrier_target(c, o, rng), -1);
  // Two jobs on one spine at 45 ms, the idle spine at 4.6: clear.
  c = view(-1, 45, -1);
  o = {view(0, 4.6, -1)};
  EXPECT_EQ(carrier_target(c, o, rng), 0);
}

TEST(CarrierSteer, HoldsARandomTimeAndDwellsAfterAMove) {
  std::mt19937 rng(2);
  std::set<int64_t> waits;
  for (int k = 0; k < 20; k++) {
    CarrierHold h;
    int64_t t = 1000;
    EXPECT_EQ(h.tick(t, -1, rng), -1);
    int64_t start = t;
    while (h.tick(t, 3, rng) < 0) t += 50;
    EXPECT_GE(t - start, kCarrierHoldMinMs);
    EXPECT_LT(t - start, kCarrierHoldMaxMs + 50);
    waits.insert(t - start);
    // The condition lapsed longer than kCarrierLapseMs: the hold starts
    // over; a shorter lapse keeps it.
    CarrierHold g;
    g.tick(1, 3, rng);
    g.tick(kCarrierLapseMs + 2, -1, rng);
    EXPECT_EQ(g.tick(kCarrierLapseMs + 2 + kCarrierHoldMinMs - 1, 3, rng), -1);
    CarrierHold f;
    f.tick(1, 3, rng);
    f.tick(2, -1, rng);
    EXPECT_EQ(f.tick(kCarrierHoldMaxMs + 1, 3, rng), 3);
    h.moved(t);
    EXPECT_EQ(h.tick(t + kCarrierDwellMs - 1, 3, rng), -1);  // dwell
  }
  EXPECT_GT(waits.size(), 5u);  // drawn, not fixed
}

TEST(CarrierSteer, TwoCollidedJobsPartAndJobsApartStay) {
  int soon = 0;
  for (int seed = 0; seed < 100; seed++) {
    // Both carriers on spine 0, the probes a second late. Two jobs whose
    // holds end within that second both move (then, drawn from a wider
    // window, they try again): most part with one move, every one in the end.
    PinnedRun r = run_pinned(seed, 0, 0, 90000, 1000);
    EXPECT_TRUE(r.apart) << "seed " << seed;
    EXPECT_EQ(r.late_moves, 0) << "seed " << seed;  // settled: no oscillation
    soon += r.apart_at_ms >= 0 && r.apart_at_ms < 30000;
    // Apart from the start: nothing moves.
    PinnedRun s = run_pinned(seed, 0, 1, 60000, 1000);
    EXPECT_EQ(s.moves, 0) << "seed " << seed;
  }
  EXPECT_GE(soon, 85);
}

}  // namespace shunt::verbs
