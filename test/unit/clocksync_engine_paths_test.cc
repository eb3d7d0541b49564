// The probe engine's source paths (probes from a chosen UDP source port)
// end to end on loopback, inside a network namespace of the test's own
// (test/unit/clocksync_engine_rig.h): their own stats, pauses, errors,
// removal, cadence, spares, and the clock segment's count of their changes.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "clocksync/clock_shm.h"
#include "clocksync/engine.h"
#include "test/unit/clocksync_engine_rig.h"

namespace shunt::clocksync {
namespace {

using namespace std::chrono_literals;
using engine_rig::config;
using engine_rig::eventually;
using engine_rig::Pair;

std::vector<SourcePathStats> reflected(const ProbeEngine& e, const std::string& peer) {
  std::vector<SourcePathStats> out;
  for (auto& r : e.report())
    if (r.name == peer)
      for (auto& sp : r.source_paths)
        if (sp.reflected) out.push_back(sp);
  return out;
}

TEST(ClocksyncEngine, SourcePathsKeepTheirOwnStats) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    std::mutex mu;
    std::vector<PathEvent> ev;
    p.a.on_source_path_change([&](const PathEvent& e) {
      std::lock_guard lk(mu);
      ev.push_back(e);
    });
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    std::string err;
    int s1 = p.a.add_source_path("b", 0, 40001, &err);
    ASSERT_GT(s1, 0) << err;
    int s2 = p.a.add_source_path("b", 0, 40002, &err);
    ASSERT_GT(s2, 0) << err;
    EXPECT_NE(s1, s2);
    ASSERT_TRUE(eventually([&] { return p.a.source_path(s1)->stats.alive && p.a.source_path(s2)->stats.alive; }));
    // One-way delays once the clock model exists (a few 0.5 s windows).
    ASSERT_TRUE(eventually([&] {
      return p.a.source_path(s1)->stats.fwd_p50_ns >= 0 && p.a.source_path(s2)->stats.rev_p50_ns >= 0;
    }, 6s));
    auto a1 = *p.a.source_path(s1), a2 = *p.a.source_path(s2);
    printf("source port %d: sent %llu received %llu fwd p50 %.0f ns rev p50 %.0f ns\n", a1.port,
           (unsigned long long)a1.stats.sent, (unsigned long long)a1.stats.received, a1.stats.fwd_p50_ns,
           a1.stats.rev_p50_ns);
    EXPECT_EQ(a1.port, 40001);
    EXPECT_EQ(a2.port, 40002);
    EXPECT_EQ(a1.rail, 0);
    EXPECT_FALSE(a1.reflected);
    EXPECT_GT(a1.stats.sent, 0u);
    EXPECT_GT(a1.stats.received, 0u);
    EXPECT_GT(a2.stats.received, 0u);
    EXPECT_LT(a1.stats.fwd_p50_ns, 1e6);  // loopback: well under a millisecond
    // The report lists both; the peer answers each as a reflected path of its own.
    auto rep = p.a.report();
    ASSERT_EQ(rep.size(), 1u);
    EXPECT_EQ(rep[0].paths.size(), 1u);  // the rail path is still the rail path
    EXPECT_EQ(rep[0].source_paths.size(), 2u);
    auto rb = reflected(p.b, "a");
    ASSERT_EQ(rb.size(), 2u);
    std::set<int> ports;
    for (auto& r : rb) {
      ports.insert(r.port);
      EXPECT_EQ(r.id, 0);
      EXPECT_TRUE(r.stats.alive);
      EXPECT_GT(r.stats.received, 0u);
    }
    EXPECT_EQ(ports, (std::set<int>{40001, 40002}));
    // The rail path kept probing and estimating on its own.
    EXPECT_TRUE(p.a.path("b", 0)->alive);
    EXPECT_TRUE(p.a.clock("b")->valid);
    std::lock_guard lk(mu);
    ASSERT_GE(ev.size(), 2u);
    for (auto& e : ev) {
      EXPECT_TRUE(e.source_id == s1 || e.source_id == s2);
      EXPECT_EQ(e.port, e.source_id == s1 ? 40001 : 40002);
      EXPECT_TRUE(e.alive);
    }
  });
}

// Pauses (pause_probing) at the same wall-clock times on both ends: nothing
// is sent during them, the thread does not spin, and no path, rail or
// source, is judged dead for the silence, which lasts five dead times;
// probing goes on between and after them. One end pausing a little later
// than the other (its command came later) is inside the margin.
TEST(ClocksyncEngine, APauseSendsNothingAndKillsNoPath) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    std::mutex mu;
    std::vector<PathEvent> ev;
    auto note = [&](const PathEvent& e) {
      std::lock_guard lk(mu);
      ev.push_back(e);
    };
    p.a.on_path_change(note);
    p.a.on_source_path_change(note);
    p.b.on_path_change(note);
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    std::string err;
    int s = p.a.add_source_path("b", 0, 40011, &err);
    ASSERT_GT(s, 0) << err;
    // Events reach the listeners from the engine's notifier thread, after
    // the state they report: wait for the source path's own "alive" event
    // (read too soon, it came after the clear, as a change in the pauses).
    ASSERT_TRUE(eventually([&] {
      std::lock_guard lk(mu);
      return std::any_of(ev.begin(), ev.end(), [&](const PathEvent& e) { return e.source_id == s && e.alive; });
    }));
    {
      std::lock_guard lk(mu);
      ev.clear();
    }
    // Two pauses of 1.2 s, 7.5 s apart; b's start 100 ms after a's.
    constexpr int64_t kLen = 1'200'000'000, kEvery = 7'500'000'000;
    const int64_t t0 = p.a.time().now();
    p.a.pause_probing(t0 + 200'000'000, t0 + 200'000'000 + kLen, kEvery, 2);
    p.b.pause_probing(t0 + 300'000'000, t0 + 300'000'000 + kLen, kEvery, 2);
    EXPECT_EQ(p.a.probing_pause(), (ProbeEngine::Pause{t0 + 200'000'000, t0 + 200'000'000 + kLen, kEvery, 2}));
    auto until = [&](int64_t t) { std::this_thread::sleep_for(std::chrono::nanoseconds(t0 + t - p.a.time().now())); };
    for (int k = 0; k < 2; k++) {
      until(k * kEvery + 400'000'000);
      const auto c0 = p.a.counters(), b0 = p.b.counters();
      until(k * kEvery + 1'300'000'000);  // inside both pauses
      const auto c1 = p.a.counters(), b1 = p.b.counters();
      EXPECT_EQ(c1.sent, c0.sent) << "pause " << k;
      EXPECT_EQ(b1.sent, b0.sent) << "pause " << k;
      // Asleep: no spin for a send it will not make (a spin is thousands),
      // and no wakeup for the estimator's windows or housekeeping either,
      // which have nothing new while paused (they were 5-6 in these 0.9 s).
      EXPECT_LE(c1.wakeups - c0.wakeups, 2u);
      EXPECT_TRUE(p.a.path("b", 0)->alive);
      EXPECT_TRUE(p.b.path("a", 0)->alive);
      EXPECT_TRUE(p.a.source_path(s)->stats.alive);
      // Between the pauses and after the last one, past its margin:
      // probing again and every path alive.
      until(k * kEvery + 1'500'000'000 + ProbeEngine::kPauseMargin + 500'000'000);
      const auto c2 = p.a.counters();
      EXPECT_GT(c2.sent, c1.sent + 20) << "after pause " << k;
      EXPECT_TRUE(p.a.path("b", 0)->alive);
      EXPECT_TRUE(p.b.path("a", 0)->alive);
      EXPECT_TRUE(p.a.source_path(s)->stats.alive);
    }
    // Not one liveness change on either end all along.
    std::lock_guard lk(mu);
    for (auto& e : ev) ADD_FAILURE() << e.peer << " path " << e.path << " source " << e.source_id << " alive " << e.alive;
    // A pause that ends before it starts cancels.
    p.a.pause_probing(5, 5);
    EXPECT_EQ(p.a.probing_pause(), ProbeEngine::Pause{});
    // Periods that would leave no time to judge liveness between two
    // pauses make one pause.
    p.a.pause_probing(t0, t0 + 1'000'000'000, 2'000'000'000, 5);
    EXPECT_EQ(p.a.probing_pause(), (ProbeEngine::Pause{t0, t0 + 1'000'000'000, 0, 1}));
  });
}

TEST(ClocksyncEngine, SourcePathErrors) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    if (!p.start()) return;
    std::string err;
    // A port another socket holds: bind fails (no SO_REUSEADDR to share it).
    int held = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(40003);
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ASSERT_EQ(bind(held, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
    EXPECT_EQ(p.a.add_source_path("b", 0, 40003, &err), 0);
    EXPECT_NE(err.find("bind"), std::string::npos) << err;
    close(held);
    EXPECT_EQ(p.a.add_source_path("nobody", 0, 40004, &err), 0);
    EXPECT_NE(err.find("unknown peer"), std::string::npos) << err;
    EXPECT_EQ(p.a.add_source_path("b", 1, 40004, &err), 0);
    EXPECT_NE(err.find("rail"), std::string::npos) << err;
    EXPECT_EQ(p.a.add_source_path("b", 0, p.a.config().port, &err), 0);
    EXPECT_NE(err.find("probe port"), std::string::npos) << err;
    // Port 0: the kernel picks one, reported back.
    int id = p.a.add_source_path("b", 0, 0, &err);
    ASSERT_GT(id, 0) << err;
    EXPECT_NE(p.a.source_path(id)->port, 0);
    EXPECT_FALSE(p.a.remove_source_path(id + 100));
  });
}

TEST(ClocksyncEngine, RemovedSourcePathFreesItsPortAndThePeerForgetsIt) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    std::string err;
    int id = p.a.add_source_path("b", 0, 40005, &err);
    ASSERT_GT(id, 0) << err;
    ASSERT_TRUE(eventually([&] { return p.a.source_path(id)->stats.alive; }));
    ASSERT_EQ(reflected(p.b, "a").size(), 1u);
    EXPECT_TRUE(p.a.remove_source_path(id));
    EXPECT_FALSE(p.a.source_path(id));
    EXPECT_TRUE(p.a.report()[0].source_paths.empty());
    // Its socket is closed by the time remove returns: the port binds again.
    int id2 = p.a.add_source_path("b", 0, 40005, &err);
    ASSERT_GT(id2, 0) << err;
    EXPECT_TRUE(p.a.remove_source_path(id2));
    // The peer stops answering a path nobody probes (after a few seconds).
    EXPECT_TRUE(eventually([&] { return reflected(p.b, "a").empty(); }, 5s));
    EXPECT_TRUE(p.a.path("b", 0)->alive);
  });
}

// SHUNT_SOURCE_PROBE_EVERY: source paths go out in every Nth round only
// (they are most of the probes), and still come alive and die.
TEST(ClocksyncEngine, SourcePathsAreProbedInEveryNthRound) {
  SKIP_UNLESS_NETNS([] {
    Pair p([](EngineConfig& c) { c.source_every = 3; });
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    ProbeEngine &a = p.a, &b = p.b;
    std::string err;
    int id = a.add_source_path("b", 0, 40008, &err);
    ASSERT_GT(id, 0) << err;
    ASSERT_TRUE(eventually([&] { return a.source_path(id)->stats.alive; }));
    uint64_t rail0 = a.path("b", 0)->sent, src0 = a.source_path(id)->stats.sent;
    std::this_thread::sleep_for(1500ms);
    uint64_t rail = a.path("b", 0)->sent - rail0, src = a.source_path(id)->stats.sent - src0;
    printf("in 1.5 s: rail path %llu probes, source path %llu\n", (unsigned long long)rail,
           (unsigned long long)src);
    EXPECT_GE(rail, 10u);
    EXPECT_GE(src * 4, rail);  // about a third
    EXPECT_LE(src * 2, rail);
    EXPECT_TRUE(a.source_path(id)->stats.alive);  // 300 ms apart, dead only after 750 ms
    b.stop();
    EXPECT_TRUE(eventually([&] { return !a.source_path(id)->stats.alive; }));
  });
}

// SHUNT_SPARE_PROBE_EVERY: a spare source path goes out in every Nth round
// only, the peer answers each of its pairs once (not on a cadence of its
// own), and a spare made a carrier again keeps its longer dead time for one
// more of them instead of dying at once of its sparse probes.
TEST(ClocksyncEngine, SparesAreProbedLessOftenAndAnsweredInKind) {
  SKIP_UNLESS_NETNS([] {
    Pair p([](EngineConfig& c) {
      c.source_every = 3;
      c.spare_every = 20;  // a pair every 2 s, dead after 5 s
    });
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    ProbeEngine &a = p.a, &b = p.b;
    std::string err;
    int busy = a.add_source_path("b", 0, 40011, &err);
    ASSERT_GT(busy, 0) << err;
    int spare = a.add_source_path("b", 0, 40012, &err);
    ASSERT_GT(spare, 0) << err;
    ASSERT_TRUE(a.set_source_path_spare(spare, true));
    EXPECT_FALSE(a.set_source_path_spare(spare + 100, true));
    ASSERT_TRUE(eventually([&] { return a.source_path(busy)->stats.alive && a.source_path(spare)->stats.alive; }, 5s));
    EXPECT_TRUE(a.source_path(spare)->spare);
    EXPECT_FALSE(a.source_path(busy)->spare);
    auto answers = [&](int port) -> uint64_t {
      for (auto& r : reflected(b, "a"))
        if (r.port == port) return r.stats.sent;
      return 0;
    };
    uint64_t b0 = a.source_path(busy)->stats.sent, s0 = a.source_path(spare)->stats.sent;
    uint64_t rb0 = answers(40011), rs0 = answers(40012);
    std::this_thread::sleep_for(4s);
    uint64_t nb = a.source_path(busy)->stats.sent - b0, ns = a.source_path(spare)->stats.sent - s0;
    uint64_t rb = answers(40011) - rb0, rs = answers(40012) - rs0;
    printf("in 4 s: busy path %llu probes (answered with %llu), spare %llu (answered with %llu)\n",
           (unsigned long long)nb, (unsigned long long)rb, (unsigned long long)ns, (unsigned long long)rs);
    EXPECT_GE(nb, 16u);      // a pair every 300 ms
    EXPECT_LE(ns * 4, nb);   // every 2 s: a sixth or so
    EXPECT_GE(ns, 2u);
    // The peer's answers follow each path's own cadence (one pair per pair,
    // give or take the one in flight at either end of the window).
    EXPECT_LE(rs, ns + 2);
    EXPECT_GE(rb + 4, nb);
    EXPECT_TRUE(a.source_path(spare)->stats.alive);  // 2 s apart, dead only after 5 s
    // Made the carrier 1.2 s after its last answer (more than the 750 ms a
    // busy path may go without one): alive, and probed from the next round.
    uint64_t got = a.source_path(spare)->stats.received;
    ASSERT_TRUE(eventually([&] { return a.source_path(spare)->stats.received > got; }, 5s));
    std::this_thread::sleep_for(1200ms);
    uint64_t sent = a.source_path(spare)->stats.sent;
    ASSERT_TRUE(a.set_source_path_spare(spare, false));
    EXPECT_FALSE(a.source_path(spare)->spare);
    bool died = false;
    for (int i = 0; i < 60; i++) {
      died |= !a.source_path(spare)->stats.alive;
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_FALSE(died);
    EXPECT_GT(a.source_path(spare)->stats.sent, sent);
    EXPECT_TRUE(a.source_path(spare)->stats.alive);
  });
}

// The clock segment counts the source paths' liveness changes (a bundle's
// worker asks the agent only when the count moved): one when the path came
// alive, one when it died; the rail path's own death is not counted.
TEST(ClocksyncEngine, SourcePathLivenessChangesMoveTheSegmentsCount) {
  SKIP_UNLESS_NETNS([] {
    std::string shm = "/shunt-clock-test-gen-" + std::to_string(getpid());
    EngineConfig ca = config("a", "127.0.0.1");
    ca.shm_name = shm;
    ProbeEngine a{ca}, b{config("b", "127.0.0.2")};
    a.add_peer({"b", {"127.0.0.2"}});
    b.add_peer({"a", {"127.0.0.1"}});
    std::string err;
    ASSERT_TRUE(a.start(&err) && b.start(&err)) << err;
    ClockReader rd;
    ASSERT_TRUE(rd.open(shm, &err)) << err;
    ASSERT_TRUE(eventually([&] { return a.path("b", 0) && a.path("b", 0)->alive; }));
    EXPECT_EQ(rd.paths_gen(), 0u);  // the rail path's liveness is not counted
    using Rails = std::vector<std::pair<std::string, std::vector<bool>>>;
    EXPECT_EQ(a.rails_alive(), (Rails{{"b", {true}}}));
    int id = a.add_source_path("b", 0, 40007, &err);
    ASSERT_GT(id, 0) << err;
    ASSERT_TRUE(eventually([&] { return a.source_path(id)->stats.alive; }));
    EXPECT_EQ(rd.paths_gen(), 1u);
    EXPECT_FALSE(rd.replaced(shm));
    b.stop();  // nobody answers: the source path dies, and so does the rail path
    ASSERT_TRUE(eventually([&] { return !a.source_path(id)->stats.alive && !a.path("b", 0)->alive; }));
    EXPECT_EQ(rd.paths_gen(), 2u);
    EXPECT_EQ(a.rails_alive(), (Rails{{"b", {false}}}));
    a.stop();  // the segment goes with its engine; a new engine's is another one
    EXPECT_TRUE(rd.replaced(shm));
  });
}

}  // namespace
}  // namespace shunt::clocksync
