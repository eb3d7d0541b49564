// Test clock, pair filter, clock publication and path view.
#include <gtest/gtest.h>

#include <functional>

#include <arpa/inet.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "clocksync/clock_shm.h"
#include "clocksync/engine.h"
#include "clocksync/engine_impl.h"
#include "clocksync/filter.h"
#include "clocksync/path_view.h"
#include "clocksync/probe_socket.h"
#include "clocksync/wire.h"
#include "clocksync/test_clock.h"

namespace shunt::clocksync {
namespace {

TEST(ClocksyncTestClock, ParsesAndAppliesOffsetDriftAndSteps) {
  std::string err;
  auto s = parse_test_clock("offset=1000,drift=100000,step=50,step_every=2,epoch=1000000000000", &err);
  ASSERT_TRUE(s) << err;
  TimeSource ts(*s);
  int64_t e = 1'000'000'000'000;
  EXPECT_EQ(ts.local(e), e + 1000);
  EXPECT_EQ(ts.local(e + 3'000'000'000), e + 3'000'000'000 + 1000 + 300'000 + 50);
  EXPECT_FALSE(parse_test_clock("drift=2000000", &err));  // 2000 ppm
  EXPECT_FALSE(parse_test_clock("offset", &err));
  EXPECT_FALSE(parse_test_clock("bogus=1", &err));
  EXPECT_FALSE(TimeSource().virtual_clock());
}

TEST(ClocksyncPairFilter, KeepsPairsWithUnchangedSpacingOnly) {
  PairFilter f(1000);
  EXPECT_EQ(f.accept({100, 3100, 20100, 23200}), 20000);  // spacing 3000 vs 3100
  EXPECT_FALSE(f.accept({100, 3100, 20100, 43100}));      // second probe queued 20 us
  EXPECT_FALSE(f.accept({100, 3100, 20100, 0}));          // second lost
  EXPECT_EQ(f.accept({100, 3100, 20900, 23100}), 20000);  // first held by batching: use second
  EXPECT_EQ(f.accepted(), 1u + 0u + 1u);
  EXPECT_EQ(f.rejected(), 2u);
}

// Pairs whose spacing changed by `err` ns (the second probe later).
PairStamps spaced(int64_t t, int64_t err) { return {t, t + 3000, t + 50'000, t + 53'000 + err}; }

TEST(ClocksyncPairFilter, WidensToTheStampsNoiseButNotToCongestion) {
  uint64_t x = 12345;
  auto noise = [&x](int64_t lo, int64_t hi) {  // uniform in [lo, hi), deterministic
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return lo + int64_t((x >> 33) % uint64_t(hi - lo));
  };
  // Software stamps on an emulated CPU: spacing errors up to 200 us. A
  // fixed 10 us keeps about one pair in twenty.
  PairFilter f(10'000);
  int kept = 0;
  for (int i = 0; i < 32 * PairFilter::kBlock; i++) kept += f.accept(spaced(i * 100'000'000LL, noise(0, 200'000))).has_value();
  EXPECT_GT(f.tolerance(), 60'000);
  EXPECT_LT(f.tolerance(), 200'000);
  EXPECT_GT(kept, 32 * PairFilter::kBlock / 4) << "tolerance " << f.tolerance();
  // A congested spell spreads every pair by 0.5-2 ms: the tolerance stays
  // with the quiet blocks' noise (the lowest of those still in the ring).
  for (int i = 0; i < 20 * PairFilter::kBlock; i++) f.accept(spaced(i * 100'000'000LL, noise(500'000, 2'000'000)));
  EXPECT_LT(f.tolerance(), 200'000);
  // Quiet stamps (a real NIC's, or veth's): the configured 10 us.
  PairFilter q(10'000);
  for (int i = 0; i < 4 * PairFilter::kBlock; i++) q.accept(spaced(i * 100'000'000LL, noise(0, 2'000)));
  EXPECT_EQ(q.tolerance(), 10'000);
  // Never past 1 ms, whatever the stamps.
  PairFilter w(10'000);
  for (int i = 0; i < 2 * PairFilter::kBlock; i++) w.accept(spaced(i * 100'000'000LL, noise(3'000'000, 9'000'000)));
  EXPECT_EQ(w.tolerance(), PairFilter::kMaxTolNs);
}

TEST(ClocksyncWindowMin, EmitsTheDetrendedMinimumPerWindow) {
  WindowMin w(1000);
  EXPECT_FALSE(w.add({100, 50}, 0));
  EXPECT_FALSE(w.add({500, 40}, 0));
  auto out = w.add({1100, 90}, 0);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->d, 40);
  // With a slope of 0.1 ns/ns the later, larger sample is the lower one.
  WindowMin s(1000);
  s.add({0, 0}, 0.1);
  s.add({900, 50}, 0.1);
  auto o2 = s.flush(5000);
  ASSERT_TRUE(o2);
  EXPECT_EQ(o2->t, 900);
}

TEST(ClocksyncShm, ReaderSeesPublishedModelsConsistently) {
  std::string name = "/shunt-clock-test-" + std::to_string(getpid());
  ClockPublisher pub;
  std::string err;
  ASSERT_TRUE(pub.open(name, 77, "me", 4, &err)) << err;
  PublishedClock c;
  c.peer_id = 5;
  c.name = "peer-a";
  c.valid = true;
  c.t_ref = 1000;
  c.offset_ns = 250.5;
  c.drift = 1e-6;
  c.bound_ns = 30;
  c.bound_rate = 1e-8;
  ASSERT_TRUE(pub.publish(0, c));
  ClockReader rd;
  ASSERT_TRUE(rd.open(name, &err)) << err;
  EXPECT_EQ(rd.self_id(), 77u);
  auto got = rd.find("peer-a");
  ASSERT_TRUE(got);
  EXPECT_DOUBLE_EQ(got->offset_at(2000), 250.5 + 1e-6 * 1000);
  EXPECT_DOUBLE_EQ(got->bound_at(1'000'001'000), 30 + 10);

  // A writer hammering the entry never lets a reader see a torn model:
  // every published pair has offset == 2 * bound.
  c.offset_ns = 0;
  c.bound_ns = 0;
  pub.publish(0, c);
  std::atomic<bool> stop{false};
  std::thread w([&] {
    PublishedClock x = c;
    for (int i = 0; !stop; i++) {
      x.offset_ns = 2.0 * i;
      x.bound_ns = i;
      pub.publish(0, x);
    }
  });
  int torn = 0;
  for (int i = 0; i < 200000; i++) {
    auto r = rd.read(0);
    torn += r && r->offset_ns != 2 * r->bound_ns;
  }
  stop = true;
  w.join();
  EXPECT_EQ(torn, 0);
  EXPECT_EQ(rd.paths_gen(), 0u);
  pub.bump_paths_gen();
  pub.bump_paths_gen();
  EXPECT_EQ(rd.paths_gen(), 2u);
  // A reader sleeping on the count wakes when it moves, not at its
  // timeout; without a change it sleeps the timeout out.
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(rd.wait_paths_gen(2, 100));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(90));
  EXPECT_TRUE(rd.wait_paths_gen(1, 5000));  // already moved past it
  std::thread bumper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pub.bump_paths_gen();
  });
  t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(rd.wait_paths_gen(2, 10000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  bumper.join();
  EXPECT_EQ(rd.paths_gen(), 3u);
  EXPECT_FALSE(rd.replaced(name));
  pub.close(true);
  EXPECT_TRUE(rd.replaced(name));  // gone
  ClockPublisher again;
  ASSERT_TRUE(again.open(name, 78, "me", 4, &err)) << err;
  EXPECT_TRUE(rd.replaced(name));  // made anew: another segment
  ClockReader rd2;
  ASSERT_TRUE(rd2.open(name, &err)) << err;
  EXPECT_FALSE(rd2.replaced(name));
  EXPECT_EQ(rd2.self_id(), 78u);
  again.close(true);
}

// A path proven both ways at 10 ms: our pair out at 0, the peer's probe
// and its feedback naming that pair at 10 ms.
constexpr int64_t kMs = 1'000'000;
PathView proven_at_10ms() {
  PathView v;
  v.on_sent(0, 10);
  v.on_received(10 * kMs, 500);
  v.on_feedback(10 * kMs, 2, 10);
  return v;
}

TEST(ClocksyncPathView, DeadAfterSilenceAliveAgainOnProof) {
  const int64_t ms = kMs, dead = 250 * ms;
  PathView v = proven_at_10ms();
  EXPECT_TRUE(v.update_liveness(20 * ms, dead));
  EXPECT_TRUE(v.alive());
  EXPECT_FALSE(v.update_liveness(200 * ms, dead));
  EXPECT_TRUE(v.update_liveness(300 * ms, dead));  // 290 ms of silence
  EXPECT_FALSE(v.alive());
  // The peer's probes arrive again but show none of ours: still dead.
  v.on_received(310 * ms, 501);
  v.on_feedback(310 * ms, 2, 10);
  EXPECT_FALSE(v.update_liveness(320 * ms, dead));
  v.on_sent(320 * ms, 11);
  v.on_feedback(330 * ms, 4, 11);
  EXPECT_TRUE(v.update_liveness(340 * ms, dead));
  EXPECT_TRUE(v.alive());
}

// `since` (the peer heard again after a silence of all its paths): an alive
// path's proofs count from then at the earliest, so it has its whole dead
// time anew; a dead path is revived only by proof of life.
TEST(ClocksyncPathView, ProofsCountFromSinceOnlyWhileAlive) {
  const int64_t ms = kMs, dead = 250 * ms;
  PathView v = proven_at_10ms();
  EXPECT_TRUE(v.update_liveness(20 * ms, dead));
  EXPECT_EQ(v.dead_at(dead), 10 * ms + dead + 1);
  EXPECT_EQ(v.dead_at(dead, 200 * ms), 200 * ms + dead + 1);
  EXPECT_FALSE(v.update_liveness(300 * ms, dead, 200 * ms));  // 100 ms since: alive
  EXPECT_TRUE(v.alive());
  EXPECT_TRUE(v.update_liveness(460 * ms, dead, 200 * ms));  // 260 ms since: dead
  EXPECT_FALSE(v.alive());
  EXPECT_EQ(v.dead_at(dead, 450 * ms), INT64_MAX);
  EXPECT_FALSE(v.update_liveness(470 * ms, dead, 460 * ms));  // no proof: stays dead
  EXPECT_FALSE(v.alive());
}

// A peer that stops (a starved guest) after a probe that named none of our
// new pairs (ours had not reached it yet): the path's last proof is the probe
// before, a round earlier, and its dead time runs out 150 ms after the
// peer's last probe, short of the silent gap (200 ms). The peer's next probe
// is overdue by then: the path is held, not declared dead. A peer heard on
// time (its other paths) holds nothing: a lost route dies on time.
TEST(ClocksyncHold, APeerWhoseProbeIsOverdueHoldsItsPaths) {
  const int64_t ms = kMs;
  EngineConfig c;
  c.interval_ns = 100 * ms;
  c.rail_every = 1;
  c.dead_ns = 250 * ms;
  c.silent_hold = 4;
  PathView v = proven_at_10ms();
  EXPECT_TRUE(v.update_liveness(20 * ms, c.dead_ns));
  v.on_received(110 * ms, 501);
  v.on_feedback(110 * ms, 2, 10);  // no pair of ours named since: no proof
  ProbeEngine::Peer p(EstimatorParams{}, 10'000);
  p.last_heard = 110 * ms;
  const int64_t due = v.dead_at(c.dead_ns);
  EXPECT_EQ(due, 10 * ms + c.dead_ns + 1);
  detail::Hold h = detail::hold_of(c, p, 0, due);
  EXPECT_EQ(h.times, 4);
  EXPECT_FALSE(v.update_liveness(due, c.dead_ns * h.times, h.since));
  EXPECT_TRUE(v.alive());
  p.last_heard = due - 50 * ms;  // heard on another path meanwhile
  h = detail::hold_of(c, p, 0, due);
  EXPECT_EQ(h.times, 1);
  EXPECT_TRUE(v.update_liveness(due, c.dead_ns * h.times, h.since));
  EXPECT_FALSE(v.alive());
}

TEST(ClocksyncPathView, LossAndDelayQuantiles) {
  PathView v;
  const int64_t ms = 1'000'000;
  for (int i = 0; i < 100; i++) {
    v.on_sent(i * 100 * ms, 1000 + i);
    // The peer got 3 of every 4 of our probes.
    v.on_feedback(i * 100 * ms + 50 * ms, uint32_t(2 * (i + 1) * 3 / 4), 1000 + i);
    v.add_delay(i * 100 * ms, true, 10'000 + (i % 10) * 100);
  }
  PathStats s = v.stats(100 * 100 * ms);
  EXPECT_NEAR(s.fwd_loss, 0.25, 0.02);
  EXPECT_NEAR(s.fwd_p50_ns, 10'400, 101);
  EXPECT_NEAR(s.fwd_p99_ns, 10'900, 1);
}

// A quiet path: 50 us base, +-2 us of jitter, then a queue of 300 us builds
// for a while and drains. The threshold comes from the jitter (6 x its median
// deviation, here the 10 us floor), the queue makes the path congested
// within a few samples, and it is clear again once drained.
TEST(ClocksyncCongestion, QueueOverTheMeasuredNoise) {
  CongestionDetector d;
  const int64_t ms = 1'000'000;
  int64_t t = 0;
  auto feed = [&](int n, double base, double jitter) {
    for (int i = 0; i < n; i++, t += 100 * ms) d.add(t, base + ((i % 3) - 1) * jitter);
  };
  feed(9, 50'000, 2'000);
  EXPECT_EQ(d.state().base_ns, -1);  // warming up: no verdict
  feed(40, 50'000, 2'000);
  EXPECT_NEAR(d.state().base_ns, 50'000, 2'001);
  EXPECT_FALSE(d.state().congested);
  EXPECT_DOUBLE_EQ(d.state().threshold_ns, CongestionDetector::kMinThresholdNs);
  feed(2, 350'000, 2'000);
  EXPECT_FALSE(d.state().congested);  // two samples do not move a median of five
  feed(2, 350'000, 2'000);
  EXPECT_TRUE(d.state().congested);
  EXPECT_GT(d.state().excess_ns, 290'000);
  EXPECT_NEAR(d.state().base_ns, 50'000, 2'001);  // the queue never becomes the base
  feed(20, 350'000, 2'000);
  EXPECT_TRUE(d.state().congested);
  feed(5, 50'000, 2'000);
  EXPECT_FALSE(d.state().congested);
  EXPECT_EQ(d.state().changes, 2u);
}

// A noisy path (+-400 us around 1 ms) gets a threshold from its own noise:
// its jitter alone never makes it congested, a 1 us floor would have.
TEST(ClocksyncCongestion, NoisyPathThresholdFollowsItsNoise) {
  CongestionDetector d;
  const int64_t ms = 1'000'000;
  uint32_t x = 12345;
  for (int i = 0; i < 600; i++) {
    x = x * 1103515245u + 12345u;
    d.add(i * 100 * ms, 1'000'000 + (double((x >> 8) % 800'001) - 400'000));
  }
  EXPECT_GT(d.state().threshold_ns, 300'000);
  EXPECT_LT(d.state().threshold_ns, 2'000'000);
  EXPECT_EQ(d.state().changes, 0u);
  // A 5 ms queue stands out of that noise.
  for (int i = 600; i < 610; i++) d.add(i * 100 * ms, 6'000'000);
  EXPECT_TRUE(d.state().congested);
}

// Hysteresis: an excess hovering around the threshold does not flap.
TEST(ClocksyncCongestion, HysteresisKeepsAHoveringPathSteady) {
  CongestionDetector d;
  const int64_t ms = 1'000'000;
  int64_t t = 0;
  for (int i = 0; i < 30; i++, t += 100 * ms) d.add(t, 100'000);
  const double thr = d.state().threshold_ns;
  for (int i = 0; i < 10; i++, t += 100 * ms) d.add(t, 100'000 + 2 * thr);
  ASSERT_TRUE(d.state().congested);
  for (int i = 0; i < 50; i++, t += 100 * ms) d.add(t, 100'000 + (i % 2 ? 0.7 : 1.3) * thr);
  EXPECT_TRUE(d.state().congested);
  EXPECT_EQ(d.state().changes, 1u);
}

// The base forgets: after a lasting route change to a longer path, the new
// delay becomes the base once the old minimum left the base's memory.
TEST(ClocksyncCongestion, BaseFollowsALastingRouteChange) {
  CongestionDetector d(1'000'000'000);  // 1 s buckets: 8 s of memory
  const int64_t ms = 1'000'000;
  int64_t t = 0;
  for (int i = 0; i < 30; i++, t += 100 * ms) d.add(t, 100'000);
  for (int i = 0; i < 120; i++, t += 100 * ms) d.add(t, 400'000);
  EXPECT_NEAR(d.state().base_ns, 400'000, 1);
  EXPECT_FALSE(d.state().congested);
}

// A path whose probes start under load judges against the seed's base: the
// same hosts' clear rail path (100 us) shows its 2 ms queue at once, where
// an unseeded one takes the queue for its base.
TEST(ClocksyncCongestion, SeededPathSeesAQueueFromItsFirstSamples) {
  const int64_t ms = 1'000'000;
  CongestionDetector rail, fresh, seeded;
  for (int i = 0; i < 40; i++) rail.add(i * 100 * ms, 100'000 + (i % 2) * 1'000);
  seeded.seed_from(4000 * ms, rail);
  for (int i = 40; i < 45; i++) {
    fresh.add(i * 100 * ms, 2'100'000);
    seeded.add(i * 100 * ms, 2'100'000);
  }
  EXPECT_TRUE(seeded.state().congested);
  EXPECT_NEAR(seeded.state().excess_ns, 2'000'000, 1'000);
  EXPECT_EQ(fresh.state().base_ns, -1);  // still warming up, and its base would be the queue
  CongestionDetector none;
  none.seed_from(0, fresh);  // a seed without a verdict seeds nothing
  EXPECT_EQ(none.state().samples, 0u);
}

TEST(ClocksyncPathView, ForwardDelaysFeedTheQueueState) {
  PathView v;
  const int64_t ms = 1'000'000;
  // Raw samples (no clock model yet: a 5 ms offset in them), then the
  // model appears: the detector carries on, its delays rebased on it.
  for (int i = 0; i < 30; i++) v.add_queue_sample(i * 100 * ms, 5'020'000, nullptr);
  EXPECT_EQ(v.stats(30 * 100 * ms).fwd_queue.samples, 30u);
  EXPECT_NEAR(v.stats(30 * 100 * ms).fwd_queue.base_ns, 5'020'000, 1);
  const std::function<double(int64_t)> off = [](int64_t) { return 5'000'000.0; };
  for (int i = 30; i < 60; i++) v.add_queue_sample(i * 100 * ms, 5'020'000, &off);
  EXPECT_NEAR(v.stats(60 * 100 * ms).fwd_queue.base_ns, 20'000, 1);
  v.add_queue_sample(60 * 100 * ms, 9'000'000, nullptr);  // the model lost a while: not taken
  for (int i = 61; i < 70; i++) v.add_queue_sample(i * 100 * ms, 5'220'000, &off);
  for (int i = 0; i < 70; i++) v.add_delay(i * 100 * ms, true, 20'000);  // the pair-filtered delays: not this state
  PathStats s = v.stats(70 * 100 * ms);
  EXPECT_TRUE(s.fwd_queue.congested);
  EXPECT_NEAR(s.fwd_queue.excess_ns, 200'000, 1);
  EXPECT_EQ(s.fwd_queue.samples, 69u);
}

// A source path seeded from its rail path while the job already queues on
// it keeps what the seed told it when the clock model appears: its delays
// are rebased on the model (with the drift, each at its own time), not
// learned anew from the queue.
TEST(ClocksyncCongestion, RebasedOnTheClockModelKeepsTheSeededBase) {
  const int64_t ms = 1'000'000;
  auto off = [](int64_t t) { return 3'000'000.0 + 80e-6 * double(t); };  // 80 ppm drift
  CongestionDetector rail, seeded;
  for (int i = 0; i < 40; i++) rail.add(i * 100 * ms, 60'000 + (i % 2) * 1'000 + off(i * 100 * ms));
  seeded.seed_from(4000 * ms, rail);
  for (int i = 40; i < 100; i++) seeded.add(i * 100 * ms, 1'060'000 + off(i * 100 * ms));  // a 1 ms queue
  ASSERT_TRUE(seeded.state().congested);
  seeded.rebase(off);
  EXPECT_TRUE(seeded.state().congested);
  EXPECT_NEAR(seeded.state().base_ns, 60'000, 100);
  EXPECT_NEAR(seeded.state().level_ns, 1'060'000, 100);
  for (int i = 100; i < 110; i++) seeded.add(i * 100 * ms, 61'000);  // on the model now: the queue drains
  EXPECT_FALSE(seeded.state().congested);
  EXPECT_NEAR(seeded.state().excess_ns, 1'000, 100);
}

// A source path that starts after the rail path's detector went on the
// clock model takes the rail's base in the model's terms: it is not rebased
// again (its queue was the peer's clock offset, 5 ms here, on every new
// source path of a host whose model was valid before its job's bundles).
TEST(ClocksyncCongestion, ASourcePathSeededFromARailOnTheModelIsNotRebasedTwice) {
  const int64_t ms = 1'000'000;
  const std::function<double(int64_t)> off = [](int64_t) { return 5'000'000.0; };
  PathView rail;
  for (int i = 0; i < 30; i++) rail.add_queue_sample(i * 100 * ms, 5'020'000 + (i % 2) * 1'000, nullptr);
  for (int i = 30; i < 40; i++) rail.add_queue_sample(i * 100 * ms, 5'020'000 + (i % 2) * 1'000, &off);
  ASSERT_NEAR(rail.stats(40 * 100 * ms).fwd_queue.base_ns, 20'000, 1);
  PathView src;
  src.seed_queue(40 * 100 * ms, rail);
  for (int i = 40; i < 60; i++) src.add_queue_sample(i * 100 * ms, 5'021'000, &off);  // no queue
  PathStats s = src.stats(60 * 100 * ms);
  EXPECT_NEAR(s.fwd_queue.base_ns, 20'000, 1'000);
  EXPECT_LT(s.fwd_queue.excess_ns, 5'000);
  EXPECT_FALSE(s.fwd_queue.congested);
  // Seeded from a rail still on raw delays, it is rebased once, as before.
  PathView raw_rail, src2;
  for (int i = 0; i < 30; i++) raw_rail.add_queue_sample(i * 100 * ms, 5'020'000 + (i % 2) * 1'000, nullptr);
  src2.seed_queue(30 * 100 * ms, raw_rail);
  for (int i = 30; i < 50; i++) src2.add_queue_sample(i * 100 * ms, 5'021'000, &off);
  EXPECT_NEAR(src2.stats(50 * 100 * ms).fwd_queue.base_ns, 20'000, 1'000);
  EXPECT_FALSE(src2.stats(50 * 100 * ms).fwd_queue.congested);
}

TEST(ClocksyncPeers, ParsesPeerLists) {
  std::vector<PeerSpec> p;
  std::string err;
  ASSERT_TRUE(parse_peers("a=10.0.0.1,10.1.0.1 b=10.0.0.2;c=10.0.0.3", &p, &err)) << err;
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].addrs.size(), 2u);
  EXPECT_EQ(p[2].name, "c");
  std::vector<PeerSpec> bad;
  EXPECT_FALSE(parse_peers("a=300.0.0.1", &bad, &err));
  EXPECT_FALSE(parse_peers("=10.0.0.1", &bad, &err));
  EXPECT_NE(node_id("a"), node_id("b"));
}

// The batched socket calls: a pair in one sendmmsg, its two send stamps
// (ids 0 and 1, then 2 and 3) from the error queue, and receives in
// batches: more datagrams than one batch holds all come, in order, with
// their stamps; one longer than the buffer comes cut, still longer than
// any probe; nothing waiting is 0.
TEST(ClocksyncSocket, PairsAndBatchesKeepIdsStampsAndOrder) {
  ProbeSocket a, b;
  std::string err;
  ASSERT_TRUE(a.open("127.0.0.1", 0, false, &err)) << err;
  ASSERT_TRUE(b.open("127.0.0.1", 0, false, &err)) << err;
  // The kernel turns receive stamping on a moment after the first socket
  // asks for it (a deferred static key): datagrams before then come unstamped.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(b.port());
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int64_t> ids;
  for (int k = 0; k < 10; k++) {  // 20 datagrams: more than two batches of 8
    uint8_t d0[2] = {uint8_t(2 * k), 0}, d1[3] = {uint8_t(2 * k + 1), 1, 1};
    int64_t id[2];
    a.send_pair(to, {d0, 2}, {d1, 3}, id);
    ids.push_back(id[0]);
    ids.push_back(id[1]);
  }
  for (int i = 0; i < 20; i++) EXPECT_EQ(ids[i], i);
  std::vector<uint8_t> first;
  std::vector<size_t> lens;
  int stamped = 0;
  int n = b.recv_all(256, [&](std::span<const uint8_t> d, const sockaddr_in& from, int64_t rx) {
    first.push_back(d[0]);
    lens.push_back(d.size());
    stamped += rx > 0;
    EXPECT_EQ(ntohs(from.sin_port), a.port());
  });
  ASSERT_EQ(n, 20);
  for (int i = 0; i < 20; i++) {
    EXPECT_EQ(first[i], i);
    EXPECT_EQ(lens[i], i % 2 ? 3u : 2u);
  }
  if (a.mode() != StampMode::user) {
    EXPECT_EQ(stamped, 20);
    std::vector<int64_t> got;
    a.drain_send_stamps([&](int64_t id, int64_t ns) {
      got.push_back(id);
      EXPECT_GT(ns, 0);
    });
    ASSERT_EQ(got.size(), 20u);
    for (int i = 0; i < 20; i++) EXPECT_EQ(got[i], i);
  }
  std::vector<uint8_t> big(ProbeSocket::kMaxDatagram + 500, 7);
  ASSERT_GE(a.send(to, big), 0);
  size_t big_len = 0;
  EXPECT_EQ(b.recv_all(256, [&](std::span<const uint8_t> d, const sockaddr_in&, int64_t) { big_len = d.size(); }), 1);
  EXPECT_EQ(big_len, ProbeSocket::kMaxDatagram);
  EXPECT_GT(big_len, kMaxProbeSize);
  EXPECT_EQ(b.recv_all(256, [&](std::span<const uint8_t>, const sockaddr_in&, int64_t) {}), 0);
}

}  // namespace
}  // namespace shunt::clocksync
