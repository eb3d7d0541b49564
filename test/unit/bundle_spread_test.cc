// The bundle's spread of large WRITEs over its shadows on a hand-built
// ibv_context (split, pipelined splits, auto), and path discovery's spread
// of the shadows over the routers that answered.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "interpose/verbs/bundle.h"
#include "interpose/verbs/bundle/testing/hooks.h"
#include "interpose/verbs/path_discovery.h"
#include "interpose/verbs/registry.h"
#include "test/unit/bundle_rig.h"

using namespace shunt::verbs;
using namespace shunt::verbs::bundle_rig;

// SHUNT_SPREAD=split: a large WRITE_WITH_IMM goes out as plain WRITEs on
// every shadow at once, covering its bytes end to end; its tail (the
// application's immediate, signal and wr_id) waits until all completed, and
// a SEND posted meanwhile waits behind the tail. The application sees one
// completion, its own.
TEST(Bundle, SplitCutsALargeWriteOverEveryShadowAndTheMessageWaitsForAllOfIt) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[256 * 1024];
  ASSERT_EQ(r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, 7, buf, sizeof buf, 0x100000, 0x1234), 0);
  ASSERT_EQ(g_posted.size(), 3u);
  uint64_t next = 0;
  std::vector<uint32_t> qpns;
  for (const auto& p : g_posted) {
    EXPECT_GE(p.qpn, 501u);
    EXPECT_EQ(p.opcode, IBV_WR_RDMA_WRITE);
    EXPECT_TRUE(p.flags & IBV_SEND_SIGNALED);
    EXPECT_EQ(p.laddr, reinterpret_cast<uint64_t>(buf) + next);  // end to end, local and remote alike
    EXPECT_EQ(p.raddr, 0x100000 + next);
    next += p.bytes;
    qpns.push_back(p.qpn);
  }
  EXPECT_EQ(next, sizeof buf - 4096);
  std::sort(qpns.begin(), qpns.end());
  EXPECT_EQ(std::unique(qpns.begin(), qpns.end()) - qpns.begin(), 3);  // one per shadow

  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 8, buf), 0);
  EXPECT_EQ(g_posted.size(), 3u);  // behind the tail
  complete(g_posted[0].qpn, 0);
  complete(g_posted[1].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  EXPECT_EQ(g_posted.size(), 3u);  // one segment still out: the tail waits
  complete(g_posted[2].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(g_posted.size(), 5u);
  EXPECT_EQ(g_posted[3].qpn, 500u);
  EXPECT_EQ(g_posted[3].opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  EXPECT_EQ(g_posted[3].wr_id, 7u);
  EXPECT_EQ(g_posted[3].imm, 0x1234u);
  EXPECT_EQ(g_posted[3].bytes, 4096u);
  EXPECT_EQ(g_posted[3].raddr, 0x100000u + sizeof buf - 4096);
  EXPECT_EQ(g_posted[3].laddr, reinterpret_cast<uint64_t>(buf) + sizeof buf - 4096);
  EXPECT_EQ(g_posted[4].wr_id, 8u);
  EXPECT_EQ(g_posted[4].qpn, 500u);
  complete(500, 7);
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(bundle_json(*r.rec)["splits"], 1);

  // Below SHUNT_SPLIT_MIN_BYTES a WRITE stays where pin puts it.
  g_posted.clear();
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 9, buf, 32768), 0);
  ASSERT_EQ(g_posted.size(), 1u);
  EXPECT_EQ(g_posted[0].qpn, 500u);
}

// The carrier's own bytes (here the tails) cross its router too: where
// discovery knows that router, the shadows on it take that much less of
// each head, so each router carries its shadows' shares of all the bytes
// (here a third on the carrier's router, one shadow of three), not a
// third of the heads plus every tail. Without the carrier's router known,
// the heads alone are shared.
TEST(Bundle, SplitCountsTheCarriersBytesInTheBalanceOfTheRouters) {
  static char buf[64 * 1024];
  auto carrier_router_part = [&](bool known) {
    Rig r;
    bundle_spread_for_test(r.rec, 2, 16384);
    bundle_router_for_test(r.rec, 0, "s1");
    bundle_router_for_test(r.rec, 1, "s2");
    bundle_router_for_test(r.rec, 2, "s2");
    if (known) bundle_router_for_test(r.rec, -1, "s1");
    std::map<uint32_t, uint64_t> by_qpn;
    for (uint64_t i = 1; i <= 40; i++) {
      g_posted.clear();
      EXPECT_EQ(r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, i, buf, sizeof buf, 0x100000 * i), 0);
      EXPECT_EQ(g_posted.size(), 3u);
      for (const auto& p : std::vector<Posted>(g_posted)) complete(p.qpn, 0);
      EXPECT_TRUE(r.poll().empty());  // the segments done: the tail goes
      complete(500, i);
      EXPECT_EQ(r.poll().size(), 1u);
      for (const auto& p : g_posted) by_qpn[p.qpn] += p.bytes;
    }
    const double all = static_cast<double>(by_qpn[500] + by_qpn[501] + by_qpn[502] + by_qpn[503]);
    EXPECT_EQ(all, 40.0 * sizeof buf);
    return static_cast<double>(by_qpn[500] + by_qpn[501]) / all;
  };
  const double unknown = carrier_router_part(false), known = carrier_router_part(true);
  EXPECT_NEAR(unknown, (60.0 / 3 + 4) / 64, 0.005);  // a third of the heads and every tail
  EXPECT_NEAR(known, 1.0 / 3, 0.01);
}

// A segment's path fails: that segment goes again (on the application's
// QP, where the tail goes too, in order after it); the error never shows.
TEST(Bundle, ASplitSegmentOnAFailedPathGoesAgainBeforeTheTail) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[128 * 1024];
  ASSERT_EQ(r.post_remote(IBV_WR_RDMA_WRITE, 3, buf, sizeof buf, 0x200000), 0);
  ASSERT_EQ(g_posted.size(), 3u);
  const Posted lost = g_posted[1];
  g_cq.push_back(error_wc(lost.qpn, 0, IBV_WC_RETRY_EXC_ERR));
  complete(g_posted[0].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(g_posted.size(), 4u);
  EXPECT_EQ(g_posted[3].qpn, 500u);  // the lost segment, as it was, at once
  EXPECT_EQ(g_posted[3].raddr, lost.raddr);
  EXPECT_EQ(g_posted[3].bytes, lost.bytes);
  complete(g_posted[2].qpn, 0);  // the last segment still out
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(g_posted.size(), 5u);
  EXPECT_EQ(g_posted[4].qpn, 500u);  // then the tail, behind the lost segment
  EXPECT_EQ(g_posted[4].wr_id, 3u);
  EXPECT_EQ(g_posted[4].bytes, 4096u);
  complete(500, 0);  // the segment (shunt's own)
  complete(500, 3);
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 3u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

// Each split starts on the next shadow: the device sends segments in the
// order they were posted, so a path always first would always complete
// first, and latency steering would take it for the fast one.
TEST(Bundle, EachSplitStartsOnTheNextShadow) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[128 * 1024];
  std::vector<uint32_t> first;
  for (uint64_t i = 0; i < 3; i++) {
    const size_t from = g_posted.size();
    ASSERT_EQ(r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, i + 1, buf, sizeof buf, 0x100000 * (i + 1)), 0);
    ASSERT_EQ(g_posted.size(), from + 3);
    first.push_back(g_posted[from].qpn);
    uint64_t covered = 0;
    for (size_t k = from; k < from + 3; k++) covered += g_posted[k].bytes;
    EXPECT_EQ(covered, sizeof buf - 4096);  // still the whole head, whichever path starts
  }
  std::sort(first.begin(), first.end());
  EXPECT_EQ(std::unique(first.begin(), first.end()) - first.begin(), 3);  // each shadow started one
}

// The next large WRITE need not wait for the last one's tail: its segments
// go at once (each path keeps its order), its tail queues behind the first
// one's; a WRITE into the range an unfinished split still writes waits.
TEST(Bundle, SplitsPipelineButNeverOverlapAnUnfinishedOne) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[128 * 1024];
  auto big = [&](uint64_t id, uint64_t raddr) {
    return r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, id, buf, sizeof buf, raddr);
  };
  ASSERT_EQ(big(1, 0x100000), 0);
  ASSERT_EQ(g_posted.size(), 3u);
  ASSERT_EQ(big(2, 0x200000), 0);  // elsewhere: out at once
  ASSERT_EQ(g_posted.size(), 6u);
  for (size_t i = 3; i < 6; i++) EXPECT_GE(g_posted[i].raddr, 0x200000u);
  ASSERT_EQ(big(3, 0x100000 + 4096), 0);  // into the first one's range: waits
  EXPECT_EQ(g_posted.size(), 6u);
  // The first group completes (each path completes in order): its tail goes,
  // the second's waits for its segments, the third WRITE behind it.
  for (size_t i = 0; i < 3; i++) complete(g_posted[i].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(g_posted.size(), 7u);
  EXPECT_EQ(g_posted[6].wr_id, 1u);
  EXPECT_EQ(g_posted[6].qpn, 500u);
  for (size_t i = 3; i < 6; i++) complete(g_posted[i].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  // The second tail, then the third WRITE's segments (the first split is done).
  ASSERT_EQ(g_posted.size(), 11u);
  EXPECT_EQ(g_posted[7].wr_id, 2u);
  EXPECT_EQ(g_posted[7].qpn, 500u);
  for (size_t i = 8; i < 11; i++) EXPECT_GE(g_posted[i].qpn, 501u);
  EXPECT_EQ(g_posted[8].raddr, 0x100000u + 4096);
  EXPECT_EQ(bundle_json(*r.rec)["splits"], 3);
}

// SHUNT_SPREAD=auto: each busy period (here one message, posted while the
// bundle was drained, to its completion) is split or pinned; after each
// mode was tried three times, large WRITEs go the way whose periods moved
// their bytes faster, split when the carrier is the slow one, pinned when
// the spread is, until the 16th choice tries the other mode again. A change
// of mode is reported by the worker, not the posting thread.
namespace {
// One 128 KiB WRITE_WITH_IMM, completed `slow_ms` after its post if it went
// the slow way (split or not); returns whether it was split.
bool auto_period(Rig& r, uint64_t id, bool split_slow, int slow_ms) {
  static char buf[128 * 1024];
  const size_t from = g_posted.size();
  EXPECT_EQ(r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, id, buf, sizeof buf, 0x100000), 0);
  const bool split = g_posted.size() == from + 3;
  EXPECT_TRUE(split || (g_posted.size() == from + 1 && g_posted[from].qpn == 500u)) << g_posted.size() - from;
  if (split == split_slow) usleep(slow_ms * 1000);
  if (split) {
    for (size_t i = from; i < from + 3; i++) complete(g_posted[i].qpn, 0);
    EXPECT_TRUE(r.poll().empty());
    EXPECT_EQ(g_posted.size(), from + 4);  // the tail
  }
  complete(500, id);
  auto wc = r.poll();
  EXPECT_EQ(wc.size(), 1u);
  return split;
}
}  // namespace

TEST(Bundle, AutoSplitsWhenTheCarrierIsSlowerAndPinsWhenItIsFaster) {
  for (bool split_slow : {false, true}) {
    Rig r;
    bundle_spread_for_test(r.rec, 3, 65536);
    std::string modes;
    for (uint64_t i = 1; i <= 17; i++) modes += auto_period(r, i, split_slow, 15) ? 's' : 'p';
    // Tried in turn, then the faster, the 16th choice the other.
    EXPECT_EQ(modes, split_slow ? "spspsppppppppppsp" : "spspspsssssssssps") << "split slow: " << split_slow;
    auto j = bundle_json(*r.rec);
    EXPECT_EQ(j["spread"], "auto");
    EXPECT_EQ(j["auto"]["now"], split_slow ? "pin" : "split");
    EXPECT_GT(j["auto"][split_slow ? "split_ns_per_kib" : "pin_ns_per_kib"].get<double>(),
              2 * j["auto"][split_slow ? "pin_ns_per_kib" : "split_ns_per_kib"].get<double>());
    // Each change of mode was chosen inside ibv_post_send: its line waits
    // in the mailbox for the worker, the posting thread never logs.
    uint64_t dropped = 0;
    const size_t changes = bundle_mail_for_test(r.rec, &dropped);
    EXPECT_GE(changes, 1u);
    EXPECT_EQ(dropped, 0u);
    EXPECT_EQ(bundle_report_mail_for_test(r.rec), changes);
    EXPECT_EQ(bundle_mail_for_test(r.rec, &dropped), 0u);
  }
}

// The answering end asks the host agent once per join: an agent that took
// the question and has not answered yet is slow (asked again), not absent.
TEST(PathDiscovery, ASlowAgentIsAskedAgainAnAbsentOneIsNot) {
  std::string path = "/tmp/shunt-unit-agent-" + std::to_string(getpid()) + ".sock";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  unlink(path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);  // takes connections, never answers
  std::vector<uint16_t> ports;
  std::vector<std::string> hops;
  EXPECT_EQ(shared_hops_via(path, "10.0.0.1", "10.0.0.2", 8, 100, true, &ports, &hops), -1);
  close(fd);
  unlink(path.c_str());
  EXPECT_EQ(shared_hops_via(path, "10.0.0.1", "10.0.0.2", 8, 100, true, &ports, &hops), 0);
  EXPECT_TRUE(ports.empty());
}

// Path discovery's choice: shadows spread evenly over the routers that
// answered, in candidate order within each, unknown ports last; with fewer
// than two routers known, the first candidates as without discovery.
TEST(PathDiscovery, PicksPortsBalancedOverTheRoutersThatAnswered) {
  using V = std::vector<int>;
  // 6 of the first 8 candidates hash to s1: the hash alone would give 6:2.
  std::vector<std::string> hops = {"s1", "s1", "s2", "s1", "s1", "s1", "s2", "s1", "s2", "", "s2", "s1"};
  V pick = balanced_pick(hops, 8);
  EXPECT_EQ(pick, (V{0, 2, 1, 6, 3, 8, 4, 10}));
  int s1 = 0, s2 = 0;
  for (int k : pick) (hops[k] == "s1" ? s1 : s2)++;
  EXPECT_EQ(s1, 4);
  EXPECT_EQ(s2, 4);
  EXPECT_EQ(balanced_pick({"s1", "", "s2", "s2", "s2"}, 4), (V{0, 2, 3, 4}));  // s1 has one: the rest from s2
  EXPECT_EQ(balanced_pick({"s1", "", "s2"}, 3), (V{0, 2, 1}));                 // unknown last
  EXPECT_EQ(balanced_pick({"", "s1", "", "s1"}, 2), (V{0, 1}));                // one router: unchanged
  EXPECT_EQ(balanced_pick({"", "", ""}, 2), (V{0, 1}));
}

// The host agent's discovery cache: one round of datagrams per (local, peer)
// serves every bundle that asks within the TTL; askers during the round hear
// "pending" and start no second round; more candidates, or an old entry,
// start a round on fresh ports.
TEST(PathDiscovery, WaitsLongerForASecondRouterBehindAQueue) {
  // Started at 1000 ms with wait_ms 100: the cap is 10 x 100 after the start.
  EXPECT_EQ(discovery_deadline(1000, 100, 0, 1000), 1100);  // nobody out there: the base wait
  EXPECT_EQ(discovery_deadline(1000, 100, 1, 1002), 2000);  // one router: up to the cap for another
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1002), 1100);  // both at once: the base wait
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1060), 1100);  // the second in time: the base wait
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1095), 1118);  // just in time: a quarter more for its burst
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1040), 1100);  // and never less than the base wait
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1600), 1750);  // one from behind a queue: a quarter more
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1950), 2000);  // never past the cap
}

TEST(PathDiscovery, OneRoundServesEveryBundleOfAHostTowardsAPeer) {
  int rounds = 0;
  std::vector<std::vector<uint16_t>> asked;
  std::vector<std::function<void()>> queued;
  HopCache cache(
      [&](const std::string& l, const std::string& p, const std::vector<uint16_t>& ports) {
        EXPECT_EQ(l, "10.0.0.1");
        EXPECT_EQ(p, "10.0.1.1");
        rounds++;
        asked.push_back(ports);
        std::vector<std::string> hops;
        for (uint16_t port : ports) hops.push_back(port & 1 ? "s1" : "s2");
        return hops;
      },
      [&](std::function<void()> w) { queued.push_back(std::move(w)); }, 60'000);
  // The first asker starts a round; it and a second asker wait for it.
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.1.1", 12, 1000));
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.1.1", 12, 1010));
  ASSERT_EQ(queued.size(), 1u);
  queued[0]();
  EXPECT_EQ(rounds, 1);
  ASSERT_EQ(asked[0].size(), 12u);
  for (uint16_t p : asked[0]) {
    EXPECT_GT(p, 0xC000);  // the port of flow label p & 0x3fff, which is not 0
    EXPECT_EQ(std::count(asked[0].begin(), asked[0].end(), p), 1);
  }
  // Every bundle now gets the same answer, without a datagram more.
  auto a = cache.get("10.0.0.1", "10.0.1.1", 12, 1200), b = cache.get("10.0.0.1", "10.0.1.1", 8, 30'000);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->ports, asked[0]);
  EXPECT_EQ(b->ports, asked[0]);
  EXPECT_EQ(a->hops.size(), 12u);
  EXPECT_EQ(a->hops[0], asked[0][0] & 1 ? "s1" : "s2");
  EXPECT_EQ(queued.size(), 1u);
  // Another peer is another round.
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.2.1", 12, 1300));
  EXPECT_EQ(queued.size(), 2u);
  // A bundle with more shadows needs more candidates: a new round, new ports.
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.1.1", 24, 2000));
  ASSERT_EQ(queued.size(), 3u);
  queued[2]();
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1].size(), 24u);
  EXPECT_NE(asked[1], asked[0]);
  // Past the TTL the answers may be stale (a spine gone): a new round.
  EXPECT_TRUE(cache.get("10.0.0.1", "10.0.1.1", 24, 61'000));
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.1.1", 24, 62'001));
  EXPECT_EQ(queued.size(), 4u);
}
