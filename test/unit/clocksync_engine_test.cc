// The probe engine end to end on loopback, inside a network namespace of the
// test's own (a thread that unshares its network namespace; skipped where
// that is not permitted): how often its thread wakes, when it declares a
// path dead.
#include <gtest/gtest.h>

#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "clocksync/engine.h"

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

// A and B on 127.0.0.1 / 127.0.0.2, each the other's peer.
struct Pair {
  ProbeEngine a{config("a", "127.0.0.1")}, b{config("b", "127.0.0.2")};
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
    // Probing one peer on one rail: a pair out and one in every 100 ms, the
    // stamps collected with the send, the loop correction every 100 ms, two
    // estimator windows a second. A 5 ms tick alone was 200 a second.
    uint64_t w0 = p.a.counters().wakeups;
    std::this_thread::sleep_for(1s);
    uint64_t probing = p.a.counters().wakeups - w0;
    EXPECT_LE(probing, 60u);
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

TEST(ClocksyncEngine, DeclaresDeadPathWithinThreeIntervalsAndWakesForNewPeers) {
  SKIP_UNLESS_NETNS([] {
    ProbeEngine a{config("a", "127.0.0.1")}, b{config("b", "127.0.0.2")};
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
    for (int i = 0; i < 100 && a.path("b", 0)->alive; i++) std::this_thread::sleep_for(10ms);
    std::lock_guard lk(mu);
    ASSERT_GE(ev.size(), 2u);
    EXPECT_TRUE(ev.front().alive);
    EXPECT_FALSE(ev.back().alive);
    double ms = double(ev.back().at - cut) / 1e6;
    printf("dead %.1f ms after the cut\n", ms);
    EXPECT_LE(ms, 300.0);  // 3 probe intervals
    EXPECT_GE(ms, 150.0);  // not before 250 ms of silence (the last pair came <= 1 interval before)
  });
}

}  // namespace
}  // namespace shunt::clocksync
