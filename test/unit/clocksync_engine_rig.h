// The probe engine's unit tests' rig: engines on loopback inside a network
// namespace of the test's own (a thread that unshares its network namespace;
// the test is skipped where that is not permitted), a pair of engines that
// probe each other, and the helpers the clocksync_engine*_test.cc files
// share. Test-only.
#pragma once
#include <gtest/gtest.h>

#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "clocksync/engine.h"

namespace shunt::clocksync::engine_rig {

using namespace std::chrono_literals;

// Runs fn on a thread in a fresh network namespace with lo up. Sockets the
// engines open there stay there; the namespace goes when the last one closes.
// Returns why it could not (then the caller skips), or "".
inline std::string in_private_netns(const std::function<void()>& fn) {
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

inline EngineConfig config(const std::string& name, const std::string& addr) {
  EngineConfig c;
  c.name = name;
  c.local_addrs = {addr};
  c.key = derive_probe_key("clocksync-engine-test");
  c.want_hw = false;
  return c;  // interval 100 ms, dead 250 ms: the defaults
}

inline EngineConfig tuned(const std::string& name, const std::string& addr,
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

template <typename F>
bool eventually(F f, std::chrono::milliseconds limit = 4s) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return f();
}

}  // namespace shunt::clocksync::engine_rig

// Runs the test's body (a lambda) in a private network namespace, or skips
// the test where one cannot be had.
#define SKIP_UNLESS_NETNS(...)                                                        \
  do {                                                                                \
    std::string why_ = ::shunt::clocksync::engine_rig::in_private_netns(__VA_ARGS__); \
    if (!why_.empty()) GTEST_SKIP() << why_;                                          \
  } while (0)
