// The bounds of what the host agent keeps for clients it cannot trust: the
// path discovery cache (anyone who reaches the control socket can ask) and
// which unauthenticated peer-channel connection gives way to a new one.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "interpose/verbs/path_discovery.h"
#include "peer/channel.h"

using shunt::peer::pending_to_evict;
using shunt::verbs::HopCache;

namespace {
// A cache whose discoveries wait in `queued` until the test runs them.
struct Cache {
  std::vector<std::function<void()>> queued;
  HopCache c;
  explicit Cache(HopCache::Limits lim)
      : c([](const std::string&, const std::string&, const std::vector<uint16_t>& ports) {
            return std::vector<std::string>(ports.size(), "s1");
          },
          [this](std::function<void()> w) { queued.push_back(std::move(w)); }, 60'000, lim) {}
  void run_all() {
    auto q = std::move(queued);
    queued.clear();
    for (auto& w : q) w();
  }
};
std::string peer(int i) { return "10.1." + std::to_string(i / 256) + "." + std::to_string(i % 256); }
}  // namespace

// Each discovery holds a socket per candidate while its datagrams are out:
// past max_running discoveries, or max_ports candidates together, none
// starts and the asker hears "busy"; a pair whose round runs hears
// "pending", not busy; once rounds end, new ones start again.
TEST(HopCacheBounds, DiscoveriesInFlightAreBounded) {
  Cache k({.max_entries = 100, .max_running = 3, .max_ports = 100});
  bool busy = true;
  EXPECT_FALSE(k.c.get("10.0.0.1", peer(1), 40, 1000, &busy));
  EXPECT_FALSE(busy);
  EXPECT_FALSE(k.c.get("10.0.0.1", peer(2), 40, 1000, &busy));
  EXPECT_FALSE(busy);
  EXPECT_EQ(k.c.running_ports(), 80);
  EXPECT_FALSE(k.c.get("10.0.0.1", peer(3), 40, 1000, &busy));  // 120 ports > 100
  EXPECT_TRUE(busy);
  EXPECT_FALSE(k.c.get("10.0.0.1", peer(3), 20, 1000, &busy));  // 100: fits
  EXPECT_FALSE(busy);
  EXPECT_FALSE(k.c.get("10.0.0.1", peer(4), 1, 1000, &busy));   // a fourth round
  EXPECT_TRUE(busy);
  EXPECT_FALSE(k.c.get("10.0.0.1", peer(1), 40, 1000, &busy));  // its round runs
  EXPECT_FALSE(busy);
  EXPECT_EQ(k.queued.size(), 3u);
  for (int i = 0; i < 50; i++) k.c.get("10.0.0.1", peer(100 + i), 8, 1000);
  EXPECT_EQ(k.queued.size(), 3u);
  k.run_all();
  EXPECT_EQ(k.c.running_ports(), 0);
  EXPECT_TRUE(k.c.get("10.0.0.1", peer(1), 40, 1100, &busy));
  EXPECT_FALSE(k.c.get("10.0.0.1", peer(4), 1, 1100, &busy));
  EXPECT_FALSE(busy);
  EXPECT_EQ(k.queued.size(), 1u);
}

// Unique peers must not grow the table for good: it never holds more than
// max_entries (the oldest goes first), and entries past their TTL go.
TEST(HopCacheBounds, EntriesAreCappedAndExpire) {
  Cache k({.max_entries = 16, .max_running = 4, .max_ports = 256});
  for (int i = 0; i < 200; i++) {
    k.c.get("10.0.0.1", peer(i), 8, 1000 + i);
    k.run_all();
    ASSERT_LE(k.c.entries(), 16u) << "after " << i + 1 << " peers";
  }
  EXPECT_EQ(k.c.entries(), 16u);
  // The newest are kept, the oldest went.
  EXPECT_TRUE(k.c.get("10.0.0.1", peer(199), 8, 1300));
  EXPECT_TRUE(k.c.get("10.0.0.1", peer(184), 8, 1300));
  EXPECT_EQ(k.queued.size(), 0u);
  EXPECT_FALSE(k.c.get("10.0.0.1", peer(0), 8, 1300));  // gone: a new round
  k.run_all();
  // Past the TTL every old entry goes at the next new pair.
  EXPECT_FALSE(k.c.get("10.0.0.1", peer(500), 8, 100'000));
  EXPECT_EQ(k.c.entries(), 1u);
  k.run_all();
  EXPECT_TRUE(k.c.get("10.0.0.1", peer(500), 8, 100'001));
}

// A round still out is never evicted: its answer lands in its own entry.
TEST(HopCacheBounds, ARunningRoundKeepsItsEntry) {
  Cache k({.max_entries = 2, .max_running = 2, .max_ports = 256});
  k.c.get("10.0.0.1", peer(1), 8, 1000);  // runs
  k.c.get("10.0.0.1", peer(2), 8, 1001);
  k.run_all();
  k.c.get("10.0.0.1", peer(3), 8, 1002);  // full: peer 1, the oldest, goes
  EXPECT_EQ(k.c.entries(), 2u);
  auto pending = std::move(k.queued);
  k.queued.clear();
  k.c.get("10.0.0.1", peer(4), 8, 1003);  // peer 2 goes; peer 3 is out
  k.run_all();
  for (auto& w : pending) w();
  EXPECT_TRUE(k.c.get("10.0.0.1", peer(3), 8, 1004));
  EXPECT_TRUE(k.c.get("10.0.0.1", peer(4), 8, 1004));
  EXPECT_EQ(k.c.entries(), 2u);
}

// A new connection to the peer channel when those still to authenticate
// are at their bound: the oldest of its own address where that address
// holds its share already, else the oldest of the address holding the
// most; below both bounds, nobody.
TEST(PeerChannelBounds, WhichPendingConnectionGivesWay) {
  using V = std::vector<uint32_t>;
  EXPECT_EQ(pending_to_evict({}, 1, 2, 4), -1);
  EXPECT_EQ(pending_to_evict(V{1, 2, 3}, 4, 2, 4), -1);
  EXPECT_EQ(pending_to_evict(V{1, 2, 1}, 1, 2, 8), 0);         // its own share full: its own oldest
  EXPECT_EQ(pending_to_evict(V{2, 1, 2, 1}, 1, 2, 8), 1);
  EXPECT_EQ(pending_to_evict(V{3, 2, 2, 2}, 1, 4, 4), 1);      // full: the crowd's oldest, not the lone one
  EXPECT_EQ(pending_to_evict(V{3, 2, 3, 2}, 1, 4, 4), 0);      // a tie: the older
  EXPECT_EQ(pending_to_evict(V{5, 6, 7, 8}, 9, 4, 4), 0);      // one each: the oldest
}

// A peer that fails the job key's check is named once, and a flood of
// forged addresses stops at the bound instead of growing the set.
TEST(ServiceBounds, KeyMismatchIsSaidOncePerPeerUpToTheBound) {
  EXPECT_TRUE(shunt::peer::first_key_mismatch("10.200.0.1"));
  EXPECT_FALSE(shunt::peer::first_key_mismatch("10.200.0.1"));
  EXPECT_TRUE(shunt::peer::first_key_mismatch("10.200.0.2"));
  int fresh = 0;
  for (int i = 0; i < 1000; i++)
    fresh += shunt::peer::first_key_mismatch("10.201." + std::to_string(i / 256) + "." + std::to_string(i % 256));
  EXPECT_LE(fresh, int(shunt::peer::kMaxKeyMismatchPeers));
  EXPECT_GT(fresh, 0);
}
