// The probe engine end to end on loopback, inside a network namespace of the
// test's own (test/unit/clocksync_engine_rig.h): how often its thread wakes,
// when it declares a path dead, rails, keys and replays; source paths are
// in clocksync_engine_paths_test.cc.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "clocksync/engine.h"
#include "core/config.h"
#include "test/unit/clocksync_engine_rig.h"

namespace shunt::clocksync {
namespace {

using namespace std::chrono_literals;
using engine_rig::config;
using engine_rig::eventually;
using engine_rig::Pair;
using engine_rig::tuned;

TEST(ClocksyncEngine, SleepsUntilSomethingIsDue) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    std::this_thread::sleep_for(600ms);
    // Probing one peer on one rail: a pair out every 100 ms, the stamps
    // collected with the send, two estimator windows a second; the loop
    // correction rides on those wakeups (35 a second when it had its own),
    // and so does reading the peer's pairs (22-25 a second when each of
    // them woke the thread). A 5 ms tick alone was 200 a second.
    uint64_t w0 = p.a.counters().wakeups;
    std::this_thread::sleep_for(1s);
    uint64_t probing = p.a.counters().wakeups - w0;
    EXPECT_LE(probing, 17u);
    // At least most of the pairs' wakeups: ten are due in the second, and
    // one delayed past its end (a loaded host) is counted in the next.
    EXPECT_GE(probing, 8u);
    // Holdover (probing off): nothing to send, nothing arriving. It once
    // spun here, polling with a timeout of 0 for a send it would not make.
    p.a.set_probing(false);
    p.b.set_probing(false);
    std::this_thread::sleep_for(300ms);
    w0 = p.a.counters().wakeups;
    std::this_thread::sleep_for(1s);
    uint64_t idle = p.a.counters().wakeups - w0;
    EXPECT_LE(idle, 20u);
    printf("wakeups per second: %llu probing 1 peer, %llu in holdover\n",
           (unsigned long long)probing, (unsigned long long)idle);
  });
}

// With a valid clock model, an estimator window's end waits for the next
// send round (the window closes then, its samples are the same): rounds 4
// a second here (a long dead time, so that no liveness deadline wakes the
// thread between them), where ending each window on time made 6. While
// the model is not valid the windows end on time (a step shows at once).
TEST(ClocksyncEngine, WindowEndsRideOnTheRoundsOnceTheModelIsValid) {
  SKIP_UNLESS_NETNS([] {
    Pair p([](EngineConfig& c) {
      c.interval_ns = 250'000'000;
      c.dead_ns = 2'000'000'000;
    });
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    auto valid = [&] {
      auto c = p.a.clock("b");
      return c && c->valid;
    };
    for (int i = 0; i < 80 && !valid(); i++) std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(valid());
    std::this_thread::sleep_for(300ms);
    uint64_t w0 = p.a.counters().wakeups;
    std::this_thread::sleep_for(2s);
    uint64_t w = p.a.counters().wakeups - w0;
    auto c = p.a.clock("b");
    ASSERT_TRUE(c && c->valid);  // still valid: the rounds kept the windows closing
    printf("wakeups in 2 s at 4 rounds a second: %llu\n", (unsigned long long)w);
    EXPECT_LE(w, 10u);
    EXPECT_GE(w, 7u);
  });
}

// The engine reads arriving probes only when something is due, unless they
// come fast: a flood (here 4000 datagrams a second of garbage) would fill
// the socket's buffer between two reads and crowd out the peer's probes.
TEST(ClocksyncEngine, AFloodIsReadAsItArrivesAndCrowdsOutNoProbe) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(7471);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    const uint64_t w0 = p.a.counters().wakeups, bad0 = p.a.counters().dropped_malformed;
    const auto before = p.a.path("b", 0);
    ASSERT_TRUE(before);
    char junk[200] = {};
    int sent = 0;
    auto end = std::chrono::steady_clock::now() + 2s;
    while (std::chrono::steady_clock::now() < end) {
      for (int k = 0; k < 40; k++) sent += sendto(fd, junk, sizeof junk, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) > 0;
      std::this_thread::sleep_for(10ms);
    }
    close(fd);
    std::this_thread::sleep_for(300ms);
    const auto after = p.a.path("b", 0);
    ASSERT_TRUE(after);
    const uint64_t wakeups = p.a.counters().wakeups - w0, bad = p.a.counters().dropped_malformed - bad0;
    printf("flood: %d sent, %llu read and dropped, %llu wakeups in 2.3 s; %llu of b's probes received\n", sent,
           (unsigned long long)bad, (unsigned long long)wakeups,
           (unsigned long long)(after->received - before->received));
    EXPECT_GE(bad, uint64_t(sent) * 90 / 100);  // the kernel dropped little of it
    EXPECT_GE(wakeups, 60u);                     // read as it came, not 13 times a second
    EXPECT_TRUE(after->alive);
    EXPECT_GE(after->received - before->received, 30u);  // b's pairs: 2 probes x 10 a second
  });
}

// (b stops: a hears nothing from it on any path, which the engine holds
// for 4 dead times by default, EngineConfig::silent_hold; the dead time
// itself is what this measures, so the hold is off.)
TEST(ClocksyncEngine, DeclaresDeadPathWithinThreeIntervalsAndWakesForNewPeers) {
  SKIP_UNLESS_NETNS([] {
    ProbeEngine a{tuned("a", "127.0.0.1", [](EngineConfig& c) { c.silent_hold = 1; })}, b{config("b", "127.0.0.2")};
    std::mutex mu;
    std::vector<PathEvent> ev;
    a.on_path_change([&](const PathEvent& e) {
      std::lock_guard lk(mu);
      ev.push_back(e);
      (void)a.report();  // callbacks run outside the engine's lock
    });
    std::string err;
    ASSERT_TRUE(a.start(&err)) << err;
    ASSERT_TRUE(b.start(&err)) << err;
    // Peers added after start: the sleeping engine must notice at once.
    std::this_thread::sleep_for(200ms);
    a.add_peer({"b", {"127.0.0.2"}});
    b.add_peer({"a", {"127.0.0.1"}});
    auto t_add = std::chrono::steady_clock::now();
    for (int i = 0; i < 300; i++) {
      auto s = a.path("b", 0);
      if (s && s->alive) break;
      std::this_thread::sleep_for(10ms);
    }
    auto up_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t_add).count();
    ASSERT_TRUE(a.path("b", 0)->alive);
    EXPECT_LE(up_ms, 500);  // a pair each way and its feedback: about 2 intervals
    std::this_thread::sleep_for(500ms);
    int64_t cut = a.time().now();
    b.stop();  // the path fails both ways at once
    auto told_dead = [&] {  // the callback runs on the engine's notifier thread, a moment later
      std::lock_guard lk(mu);
      return !ev.empty() && !ev.back().alive;
    };
    for (int i = 0; i < 100 && (a.path("b", 0)->alive || !told_dead()); i++) std::this_thread::sleep_for(10ms);
    int64_t heard = a.path("b", 0)->last_heard_ns;
    std::lock_guard lk(mu);
    ASSERT_GE(ev.size(), 2u);
    EXPECT_TRUE(ev.front().alive);
    EXPECT_FALSE(ev.back().alive);
    double ms = double(ev.back().at - cut) / 1e6, silent = double(ev.back().at - heard) / 1e6;
    printf("dead %.1f ms after the cut, %.1f ms after the last proof of life\n", ms, silent);
    EXPECT_LE(ms, 300.0);  // 3 probe intervals
    // At its deadline: after 250 ms of silence, not before (the upper limit
    // leaves room for a busy machine; here it is 250.1 ms).
    EXPECT_GT(silent, 250.0);
    EXPECT_LE(silent, 290.0);
  });
}

// A listener that takes its time (the sockets' rail thread once made it wait
// up to a second for a lock held through netlink round trips) delays no
// probe: callbacks run on the engine's notifier thread. When they ran on the
// engine thread, the peer heard nothing meanwhile and declared its path dead
// 250 ms later; in a job that failed a bundle's application QP for good.
TEST(ClocksyncEngine, ASlowListenerDelaysNoProbe) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    std::atomic<int> calls{0};
    std::atomic<bool> in_listener{false};
    p.a.add_path_listener([&](const PathEvent&) {
      if (calls++ == 0) {  // the first: the path to b is alive
        in_listener = true;
        std::this_thread::sleep_for(1200ms);
        in_listener = false;
      }
    });
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    auto end = std::chrono::steady_clock::now() + 3s;
    while (!in_listener && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(in_listener.load());
    uint64_t sent0 = p.a.counters().sent;
    int checks = 0, dead_at_b = 0, dead_at_a = 0;
    while (in_listener) {
      auto pb = p.b.path("a", 0), pa = p.a.path("b", 0);
      dead_at_b += !(pb && pb->alive);
      dead_at_a += !(pa && pa->alive);
      checks++;
      std::this_thread::sleep_for(10ms);
    }
    uint64_t sent = p.a.counters().sent - sent0;
    printf("while a's listener slept: %d checks, b saw a's path dead in %d, a saw b's dead in %d; a sent %llu probes\n",
           checks, dead_at_b, dead_at_a, (unsigned long long)sent);
    EXPECT_GE(checks, 50);
    EXPECT_EQ(dead_at_b, 0);
    EXPECT_EQ(dead_at_a, 0);
    EXPECT_GE(sent, 12u);  // a pair every 100 ms for over a second
    EXPECT_EQ(calls.load(), 1);  // nothing changed meanwhile
  });
}

// A peer host that stops for a while (a starved guest: its probe thread not
// scheduled) sends nothing on any path: that is no dead route, and nowhere
// else to go either. Its paths live through a silence shorter than
// silent_hold x their dead time (here b pauses for 800 ms, where 250 ms
// killed them without the hold), and once b is heard again each has its
// dead time anew to prove itself; a peer silent for longer is dead after
// that many dead times.
TEST(ClocksyncEngine, APeerSilentOnEveryPathIsHeldNotDeclaredDead) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    std::mutex mu;
    std::vector<PathEvent> ev;
    p.a.on_path_change([&](const PathEvent& e) {
      std::lock_guard lk(mu);
      ev.push_back(e);
    });
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    std::this_thread::sleep_for(300ms);
    {
      std::lock_guard lk(mu);
      ev.clear();
    }
    const int64_t t0 = p.b.time().now();
    p.b.pause_probing(t0 + 100'000'000, t0 + 900'000'000, 0, 1);  // b only: a hears nothing from it
    int checks = 0, dead = 0;
    for (auto end = std::chrono::steady_clock::now() + 1500ms; std::chrono::steady_clock::now() < end;) {
      auto s = p.a.path("b", 0);
      dead += !(s && s->alive);
      checks++;
      std::this_thread::sleep_for(10ms);
    }
    uint64_t received = p.a.path("b", 0)->received;
    printf("b paused 800 ms: a saw its path dead in %d of %d checks\n", dead, checks);
    EXPECT_GE(checks, 100);
    EXPECT_EQ(dead, 0);
    {
      std::lock_guard lk(mu);
      EXPECT_TRUE(ev.empty());  // no change told
    }
    std::this_thread::sleep_for(300ms);
    EXPECT_GT(p.a.path("b", 0)->received, received);  // b's probes again
    // Gone for good: dead after 4 x 250 ms of silence.
    p.b.stop();
    ASSERT_TRUE(eventually([&] {
      std::lock_guard lk(mu);
      return !ev.empty() && !ev.back().alive;
    }));
    std::lock_guard lk(mu);
    double silent = double(ev.back().at - p.a.path("b", 0)->last_heard_ns) / 1e6;
    printf("b stopped: dead %.0f ms after its last proof of life\n", silent);
    EXPECT_GT(silent, 1000.0);
    EXPECT_LE(silent, 1100.0);
  });
}

// SHUNT_RAIL_PROBE_EVERY (4, the default): the rails of a two-rail peer go
// out together in every fourth round, and the thread wakes only for those
// (and its estimator windows); a peer with one rail gets a pair every
// second round (the clock's floor: a pair every other round on average);
// each rail is dead after 4 x dead_ns (b stops, so no silent hold here).
TEST(ClocksyncEngine, RailsEveryNthRound) {
  SKIP_UNLESS_NETNS([] {
    auto tune = [](EngineConfig& c) {
      c.rail_every = 4;
      c.silent_hold = 1;
    };
    EngineConfig ca = tuned("a", "127.0.0.1", tune), cb = tuned("b", "127.0.0.2", tune),
                 cc = tuned("c", "127.0.0.5", tune);
    ca.local_addrs.push_back("127.0.0.3");
    cb.local_addrs.push_back("127.0.0.4");
    ProbeEngine a{ca}, b{cb}, c{cc};
    std::mutex mu;
    std::vector<std::pair<PathEvent, int64_t>> dead;  // with the last proof of life before
    a.on_path_change([&](const PathEvent& e) {
      if (e.alive || e.peer != "b") return;
      auto s = a.path(e.peer, e.path);
      std::lock_guard lk(mu);
      dead.push_back({e, s ? s->last_heard_ns : 0});
    });
    a.add_peer({"b", {"127.0.0.2", "127.0.0.4"}});
    b.add_peer({"a", {"127.0.0.1", "127.0.0.3"}});
    c.add_peer({"a", {"127.0.0.1"}});
    std::string err;
    ASSERT_TRUE(a.start(&err) && b.start(&err) && c.start(&err)) << err;
    auto alive = [&](const char* peer, int rail) { auto s = a.path(peer, rail); return s && s->alive; };
    ASSERT_TRUE(eventually([&] { return alive("b", 0) && alive("b", 1); }));
    auto sent = [&](const char* peer, int rail) { return a.path(peer, rail)->sent; };
    std::this_thread::sleep_for(500ms);
    uint64_t b0 = sent("b", 0), b1 = sent("b", 1), w = a.counters().wakeups;
    std::this_thread::sleep_for(4s);
    b0 = sent("b", 0) - b0, b1 = sent("b", 1) - b1, w = a.counters().wakeups - w;
    // Every fourth round: 10 pairs, 20 probes, on each rail in 4 s; 10
    // rounds and up to 16 estimator windows (those of a model not yet
    // valid end on time). With the rails in every second round (N = 2) the
    // thread woke 14 times in 2 s.
    printf("in 4 s: to b rail 0 %llu probes, rail 1 %llu; %llu wakeups\n", (unsigned long long)b0,
           (unsigned long long)b1, (unsigned long long)w);
    for (uint64_t n : {b0, b1}) {
      EXPECT_GE(n, 16u);
      EXPECT_LE(n, 24u);
    }
    EXPECT_LE(w, 24u);
    // A peer with one rail: a pair every second round.
    a.add_peer({"c", {"127.0.0.5"}});
    ASSERT_TRUE(eventually([&] { return alive("c", 0); }));
    uint64_t c0 = sent("c", 0);
    std::this_thread::sleep_for(2s);
    c0 = sent("c", 0) - c0;
    printf("in 2 s: to c (one rail) %llu probes\n", (unsigned long long)c0);
    EXPECT_GE(c0, 16u);
    EXPECT_LE(c0, 24u);
    // Dead after 4 x 250 ms without a probe, not 250 ms (nor 500).
    int64_t cut = a.time().now();
    b.stop();
    ASSERT_TRUE(eventually([&] {
      std::lock_guard lk(mu);
      return dead.size() >= 2;
    }, 3s));
    std::lock_guard lk(mu);
    for (auto& [e, heard] : dead) {
      double silent = double(e.at - heard) / 1e6, since_cut = double(e.at - cut) / 1e6;
      printf("rail %d: dead %.0f ms after the cut, %.0f ms after its last proof of life\n", e.path, since_cut,
             silent);
      EXPECT_GT(silent, 1000.0);
      EXPECT_LE(silent, 1060.0);
    }
    EXPECT_TRUE(alive("c", 0));
  });
}

// Without SHUNT_JOB_KEY the engine has no key and does not start: every
// engine without one used to sign with the key of an empty secret, which
// anyone can derive and forge probes under. With one, it starts.
TEST(ClocksyncEngine, DoesNotProbeWithoutAKey) {
  SKIP_UNLESS_NETNS([] {
    std::map<std::string, std::string> env{{"SHUNT_PROBE_ADDRS", "127.0.0.1"}, {"SHUNT_CLOCK_SHM", ""}};
    auto from_env = [&](EngineConfig* ec) {
      std::vector<ConfigError> errs;
      std::vector<std::string> warns;
      Config c = load_config(
          [&](const char* n) -> const char* {
            auto it = env.find(n);
            return it == env.end() ? nullptr : it->second.c_str();
          },
          &errs, &warns, nullptr);
      std::string err;
      ASSERT_TRUE(errs.empty());
      ASSERT_TRUE(engine_config_from(c, ec, nullptr, &err)) << err;
    };
    EngineConfig keyless, keyed;
    from_env(&keyless);
    EXPECT_EQ(keyless.key, Key{});
    ProbeEngine e{keyless};
    std::string err;
    EXPECT_FALSE(e.start(&err));
    EXPECT_NE(err.find("SHUNT_JOB_KEY"), std::string::npos) << err;
    EXPECT_EQ(e.counters().sent, 0u);
    env["SHUNT_JOB_KEY"] = "k";
    from_env(&keyed);
    EXPECT_EQ(keyed.key, derive_probe_key("k"));
    ProbeEngine k{keyed};
    EXPECT_TRUE(k.start(&err)) << err;
  });
}

// Sends a coded pair as b to a (127.0.0.1) on rail 0, pair number `seq`,
// under `key`, from the probe port of `from` (bound here; b's own address
// only while b is stopped). It names no pair of a's: what a restarted b
// sends before it has heard a, or a replay.
void send_pair_as_b(const char* from, uint64_t seq, const Key& key) {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in me{}, to{};
  me.sin_family = to.sin_family = AF_INET;
  me.sin_port = to.sin_port = htons(7471);
  inet_pton(AF_INET, from, &me.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&me), sizeof me), 0) << strerror(errno);
  Probe pr;
  pr.sender_id = node_id("b");
  pr.receiver_id = node_id("a");
  pr.seq = seq;
  pr.tx_app_ns = TimeSource::kernel_now();
  for (uint8_t idx = 0; idx < 2; idx++) {
    pr.idx = idx;
    std::array<uint8_t, kMaxProbeSize> buf;
    size_t n = encode(pr, key, buf);
    EXPECT_EQ(sendto(fd, buf.data(), n, 0, reinterpret_cast<sockaddr*>(&to), sizeof to), ssize_t(n));
  }
  close(fd);
}

// A pair numbered 2^62 under the job's key (a restarted or confused peer)
// does not move a's replay window: b's pairs, numbered far below it, are
// still taken and the path lives on. A pair under the empty secret's key
// is dropped as unauthenticated. Before, the 2^62 pair was taken and every
// later pair of b's dropped as a replay: the path died within its dead
// time and stayed dead while a ran.
TEST(ClocksyncEngine, APairFarAheadDoesNotHoldThePath) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    const EngineCounters c0 = p.a.counters();
    const uint64_t got = p.a.path("b", 0)->received;
    send_pair_as_b("127.0.0.3", 1ull << 62, derive_probe_key("clocksync-engine-test"));
    send_pair_as_b("127.0.0.3", (1ull << 62) + 1, derive_probe_key(""));
    bool died = false;
    for (int i = 0; i < 100; i++) {  // 1 s, four dead times
      died |= !p.a.path("b", 0)->alive;
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_FALSE(died);
    EXPECT_GE(p.a.path("b", 0)->received, got + 10);
    const EngineCounters c = p.a.counters();
    EXPECT_GE(c.dropped_replay - c0.dropped_replay, 2u);
    EXPECT_EQ(c.dropped_auth - c0.dropped_auth, 2u);
  });
}

// b restarts (its pair numbers start anew, at random) after a pair
// numbered 2^62 came from b's address under the job's key: a takes the new
// b's pairs within a few rounds (the new b proves it hears a by naming a's
// pair in its feedback) and the path is alive again. Before, a dropped
// every pair of the new b as a replay until a itself restarted.
TEST(ClocksyncEngine, ARestartedPeerIsTakenAgainPromptly) {
  SKIP_UNLESS_NETNS([] {
    Pair p;
    if (!p.start()) return;
    ASSERT_TRUE(p.wait_alive());
    p.b.stop();
    send_pair_as_b("127.0.0.2", 1ull << 62, derive_probe_key("clocksync-engine-test"));
    ASSERT_TRUE(eventually([&] { return !p.a.path("b", 0)->alive; }, 2s));
    ProbeEngine b2{config("b", "127.0.0.2")};
    b2.add_peer({"a", {"127.0.0.1"}});
    std::string err;
    ASSERT_TRUE(b2.start(&err)) << err;
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(eventually([&] { return p.a.path("b", 0)->alive && b2.path("a", 0)->alive; }, 2s));
    printf("alive again %lld ms after b restarted\n",
           (long long)std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
    const uint64_t got = p.a.path("b", 0)->received;
    std::this_thread::sleep_for(500ms);
    EXPECT_GE(p.a.path("b", 0)->received, got + 6);
    EXPECT_TRUE(p.a.path("b", 0)->alive);
  });
}

}  // namespace
}  // namespace shunt::clocksync
