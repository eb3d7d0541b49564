// The probe engine end to end on loopback, inside a network namespace of the
// test's own (a thread that unshares its network namespace; skipped where
// that is not permitted): how often its thread wakes, when it declares a
// path dead, source paths (probes from a chosen UDP source port).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "clocksync/clock_shm.h"
#include "clocksync/engine.h"
#include "core/config.h"

namespace shunt::clocksync {
namespace {

using namespace std::chrono_literals;

// Runs fn on a thread in a fresh network namespace with lo up. Sockets the
// engines open there stay there; the namespace goes when the last one closes.
// Returns why it could not (then the caller skips), or "".
std::string in_private_netns(const std::function<void()>& fn) {
  std::string why;
  std::thread t([&] {
    if (unshare(CLONE_NEWNET) != 0) {
      why = std::string("unshare(CLONE_NEWNET): ") + strerror(errno);
      return;
    }
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    if (fd < 0 || ioctl(fd, SIOCGIFFLAGS, &ifr) != 0 ||
        (ifr.ifr_flags |= IFF_UP, ioctl(fd, SIOCSIFFLAGS, &ifr)) != 0) {
      why = std::string("lo up: ") + strerror(errno);
      if (fd >= 0) close(fd);
      return;
    }
    close(fd);
    fn();
  });
  t.join();
  return why;
}

EngineConfig config(const std::string& name, const std::string& addr) {
  EngineConfig c;
  c.name = name;
  c.local_addrs = {addr};
  c.key = derive_probe_key("clocksync-engine-test");
  c.want_hw = false;
  return c;  // interval 100 ms, dead 250 ms: the defaults
}

EngineConfig tuned(const std::string& name, const std::string& addr,
                   const std::function<void(EngineConfig&)>& tune) {
  EngineConfig c = config(name, addr);
  if (tune) tune(c);
  return c;
}

// A and B on 127.0.0.1 / 127.0.0.2, each the other's peer; `tune` changes
// both ends' configuration.
struct Pair {
  ProbeEngine a, b;
  explicit Pair(const std::function<void(EngineConfig&)>& tune = {})
      : a{tuned("a", "127.0.0.1", tune)}, b{tuned("b", "127.0.0.2", tune)} {}
  bool start() {
    a.add_peer({"b", {"127.0.0.2"}});
    b.add_peer({"a", {"127.0.0.1"}});
    std::string err;
    bool ok = a.start(&err) && b.start(&err);
    EXPECT_TRUE(ok) << err;
    return ok;
  }
  bool wait_alive(std::chrono::milliseconds limit = 3s) {
    auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      auto pa = a.path("b", 0), pb = b.path("a", 0);
      if (pa && pa->alive && pb && pb->alive) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

#define SKIP_UNLESS_NETNS(...)                       \
  do {                                               \
    std::string why_ = in_private_netns(__VA_ARGS__); \
    if (!why_.empty()) GTEST_SKIP() << why_;         \
  } while (0)

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
    EXPECT_GE(probing, 10u);
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

template <typename F>
bool eventually(F f, std::chrono::milliseconds limit = 4s) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
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
