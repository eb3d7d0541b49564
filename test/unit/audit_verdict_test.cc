// shunt-audit's judgement: thresholds against the fleet's median with
// floors, the verdict's exit status, where a fault lands in the tree.
#include <gtest/gtest.h>

#include <set>

#include "tools/shunt-audit/verdict.h"

using namespace audit;
using nlohmann::json;

namespace {

json port(const std::string& state = "ACTIVE", int mtu = 1024, const std::string& ip = "10.0.1.2") {
  json p{{"port", 1},
         {"state", state},
         {"mtu", mtu},
         {"width", "1X"},
         {"speed", "10 Gb/sec (1X QDR)"},
         {"netdev", "r0"},
         {"netdev_mtu", "1500"},
         {"counters", {{"symbol_error", 0}, {"rcvd_seq_err", 0}}}};
  if (!ip.empty()) p["ipv4"] = ip, p["gid_index"] = 1;
  return p;
}

json host(json p0 = port(), json p1 = port()) {
  return {{"hostname", "h"},
          {"kernel", "6.1.0"},
          {"provider_modules", {"rdma_rxe"}},
          {"mptcp", 1},
          {"rdma_core", "44.0"},
          {"memlock", {{"soft", -1}, {"cap_ipc_lock", false}}},
          {"nccl", json::object()},
          {"devices", {{{"name", "rxe0"}, {"ports", {p0}}}, {{"name", "rxe1"}, {"ports", {p1}}}}},
          {"reach", {true, true, true, true}}};
}

json counters(int symbol = 0, int seq = 0) {
  json c{{"symbol_error", symbol}, {"rcvd_seq_err", seq}};
  return {{"rxe0/1", c}, {"rxe1/1", c}};
}

const std::vector<std::string> kNames{"h1", "h2", "h3", "h4"};

// Every ordered pair on both rails through two routers per source, at `bw`.
std::vector<Measurement> mesh(double bw = 20, double lat = 100) {
  std::vector<Measurement> m;
  for (int r = 0; r < 2; r++)
    for (int a = 0; a < 4; a++)
      for (int b = 0; b < 4; b++)
        if (a != b)
          for (int s = 0; s < 2; s++)
            m.push_back({a, b, r, "192.168." + std::to_string(a) + "." + std::to_string(2 + 4 * s),
                         0xC001 + s, bw, lat});
  return m;
}

// The leaves (checks) that did not pass, as "path/to/leaf".
void bad_leaves(const Node& n, const std::string& path, std::vector<std::string>* out) {
  std::string p = path.empty() ? n.name : path + "/" + n.name;
  if (n.children.empty() && n.status != Status::pass) out->push_back(p);
  for (auto& c : n.children) bad_leaves(c, p, out);
}
std::vector<std::string> bad_leaves(const Node& n) {
  std::vector<std::string> v;
  bad_leaves(n, "", &v);
  return v;
}

Node judge(std::vector<json> facts, std::vector<json> after, const std::vector<Measurement>& m,
           Thresholds t = {}) {
  return evaluate(facts, kNames, after, m, t);
}

}  // namespace

TEST(AuditVerdict, BandwidthIsJudgedAgainstTheMedianAndTheFloors) {
  EXPECT_EQ(judge_higher(10, 20, 0.5, 0.3, 0, 0), Status::pass);
  EXPECT_EQ(judge_higher(9, 20, 0.5, 0.3, 0, 0), Status::warn);
  EXPECT_EQ(judge_higher(5, 20, 0.5, 0.3, 0, 0), Status::fail);
  // The whole fleet slow: relative to itself it passes, the floors catch it.
  EXPECT_EQ(judge_higher(20, 20, 0.5, 0.3, 0, 0), Status::pass);
  EXPECT_EQ(judge_higher(20, 20, 0.5, 0.3, 50, 0), Status::warn);
  EXPECT_EQ(judge_higher(20, 20, 0.5, 0.3, 50, 25), Status::fail);
}

TEST(AuditVerdict, LatencyWithinTheSlackPassesHoweverManyTimesTheMedian) {
  EXPECT_EQ(judge_lower(40, 10, 3, 10, 300), Status::pass);  // 4x, but 30 us
  EXPECT_EQ(judge_lower(1400, 400, 3, 10, 300), Status::warn);
  EXPECT_EQ(judge_lower(5000, 400, 3, 10, 300), Status::fail);
  EXPECT_EQ(judge_lower(1000, 400, 3, 10, 300), Status::pass);  // 600 us over, but 2.5x
}

TEST(AuditVerdict, MedianAndMajority) {
  EXPECT_EQ(median({}), 0);
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 2, 3}), 2.5);
  EXPECT_EQ(majority({"a", "b", "b"}), "b");
  EXPECT_EQ(majority({"b", "a"}), "a");  // a tie: the smallest, whatever the order
}

TEST(AuditVerdict, AHealthyFleetPassesWithExitZero) {
  Node n = judge({host(), host(), host(), host()}, {counters(), counters(), counters(), counters()},
                 mesh());
  EXPECT_EQ(bad_leaves(n), std::vector<std::string>{});
  EXPECT_EQ(n.status, Status::pass);
  EXPECT_EQ(exit_code(n.status), 0);
}

TEST(AuditVerdict, APortDownFailsThatPortAndItsPairsAreSkippedNotFailed) {
  auto m = mesh();
  std::erase_if(m, [](const Measurement& x) { return x.rail == 1 && (x.src == 1 || x.dst == 1); });
  for (int o : {0, 2, 3}) {
    m.push_back({1, o, 1, "", 0, 0, 0, "", "h2's rxe1 port is not ACTIVE"});
    m.push_back({o, 1, 1, "", 0, 0, 0, "", "h2's rxe1 port is not ACTIVE"});
  }
  Node n = judge({host(), host(port(), port("DOWN")), host(), host()},
                 {counters(), counters(), counters(), counters()}, m);
  EXPECT_EQ(bad_leaves(n), std::vector<std::string>{"fleet/Node/h2/rxe1 port 1/state"});
  EXPECT_EQ(exit_code(n.status), 2);
}

TEST(AuditVerdict, AnMtuThatDiffersFromTheFleetWarnsAtThatNic) {
  Node n = judge({host(), host(), host(), host(port(), port("ACTIVE", 512))},
                 {counters(), counters(), counters(), counters()}, mesh());
  EXPECT_EQ(bad_leaves(n), std::vector<std::string>{"fleet/Node/h4/rxe1 port 1/mtu"});
  EXPECT_EQ(exit_code(n.status), 1);
}

TEST(AuditVerdict, APortWithoutAnIpv4RoceGidFails) {
  Node n = judge({host(port("ACTIVE", 1024, "")), host(), host(), host()},
                 {counters(), counters(), counters(), counters()}, mesh());
  EXPECT_EQ(bad_leaves(n), std::vector<std::string>{"fleet/Node/h1/rxe0 port 1/IPv4 RoCEv2 GID"});
}

TEST(AuditVerdict, ALinkErrorCounterRisingFailsARetransmitCounterWarnsOnlyAboveTheFleet) {
  // h3: symbol errors rose by 1 (fails); h2: sequence errors +500 where the
  // fleet rose by about 10 (warns); h4 +150, under the absolute bar (passes).
  Node n = judge({host(), host(), host(), host()},
                 {counters(0, 10), counters(0, 500), counters(1, 10), counters(0, 150)}, mesh());
  EXPECT_EQ(bad_leaves(n), (std::vector<std::string>{"fleet/Node/h2/rxe0 port 1/error counters",
                                                     "fleet/Node/h2/rxe1 port 1/error counters",
                                                     "fleet/Node/h3/rxe0 port 1/error counters",
                                                     "fleet/Node/h3/rxe1 port 1/error counters"}));
  EXPECT_EQ(n.children[1].children[2].status, Status::fail);
  EXPECT_EQ(n.children[1].children[1].status, Status::warn);
}

TEST(AuditVerdict, SoftwareThatDiffersOnOneHostWarnsThatHost) {
  json odd = host();
  odd["kernel"] = "6.5.0";
  odd["mptcp"] = 0;
  Node n = judge({host(), host(), odd, host()}, {counters(), counters(), counters(), counters()},
                 mesh());
  EXPECT_EQ(bad_leaves(n),
            (std::vector<std::string>{"fleet/Software/kernel/h3", "fleet/Software/MPTCP/h3"}));
  EXPECT_EQ(exit_code(n.status), 1);
}

TEST(AuditVerdict, NcclThatShuntDoesNotReachWarnsAndMissingNcclFailsOnlyWhenExpected) {
  json with = host();
  with["nccl"] = {{"path", "/usr/lib/libnccl.so.2.19.3"}, {"version", "2.19.3"}};
  Node n = judge({with, host(), host(), host()}, {counters(), counters(), counters(), counters()},
                 mesh());
  EXPECT_EQ(bad_leaves(n), std::vector<std::string>{"fleet/Software/NCCL/h1"});
  with["shunt_preloaded"] = true;
  n = judge({with, host(), host(), host()}, {counters(), counters(), counters(), counters()},
            mesh());
  EXPECT_EQ(bad_leaves(n), std::vector<std::string>{});
  Thresholds t;
  t.expect_nccl = true;
  n = judge({with, host(), host(), host()}, {counters(), counters(), counters(), counters()},
            mesh(), t);
  EXPECT_EQ(bad_leaves(n).size(), 3u);
}

TEST(AuditVerdict, ASlowUplinkIsNamedAsThatLinkNotAsItsPairs) {
  // h1's rail-0 traffic through its second router at a fifth and 50 times
  // the latency, and what others sent to h1 on rail 0 through that spine.
  auto m = mesh();
  for (auto& x : m)
    if (x.rail == 0 &&
        ((x.src == 0 && x.router == "192.168.0.6") || (x.dst == 0 && x.sport == 0xC001)))
      x.mbps = 4, x.lat_us = 5000;  // the link's queue delays its reads too
  Judged j = judge_backend(m, Thresholds{});
  ASSERT_EQ(j.links.size(), 1u);
  EXPECT_EQ(j.links[0].host, 0);
  EXPECT_EQ(j.links[0].rail, 0);
  EXPECT_EQ(j.links[0].router, "192.168.0.6");
  EXPECT_EQ(j.links[0].status, Status::fail);
  Node n =
      judge({host(), host(), host(), host()}, {counters(), counters(), counters(), counters()}, m);
  EXPECT_EQ(bad_leaves(n),
            std::vector<std::string>{
                "fleet/Back-end network/rail 0/leaf-spine links/h1's leaf <-> 192.168.0.6"});
}

TEST(AuditVerdict, TwoDegradedLinksCarryingHalfTheRailAreBothNamed) {
  // Healthy paths differ (11 or 20 MB/s); h3's uplink to one spine loses
  // (0.5 MB/s) and h1's to the other is limited (4 MB/s), both ways: 12 of
  // the rail's 24 measurements cross one of them, and the median of them all
  // (7.5 MB/s) would pass the limited link.
  auto m = mesh();
  for (size_t i = 0; i < m.size(); i++) m[i].mbps = i % 2 ? 20 : 11;
  for (auto& x : m) {
    if (x.rail != 0) continue;
    if ((x.src == 2 && x.router == "192.168.2.2") || (x.dst == 2 && x.sport == 0xC001)) x.mbps = 0.5;
    if ((x.src == 0 && x.router == "192.168.0.6") || (x.dst == 0 && x.sport == 0xC002)) x.mbps = 4;
  }
  Judged j = judge_backend(m, Thresholds{});
  ASSERT_EQ(j.links.size(), 2u);
  std::set<std::pair<int, std::string>> named;
  for (auto& l : j.links) {
    EXPECT_EQ(l.rail, 0);
    EXPECT_NE(l.status, Status::pass);
    named.insert({l.host, l.router});
  }
  EXPECT_EQ(named, (std::set<std::pair<int, std::string>>{{0, "192.168.0.6"}, {2, "192.168.2.2"}}));
  EXPECT_GE(j.bw_median.at(0), 11.0);  // the healthy paths' median
  for (size_t i = 0; i < m.size(); i++) EXPECT_EQ(j.bw[i], Status::pass) << i;
}

TEST(AuditVerdict, AConnectionThatFailedDownADegradedLinkIsThatLinks) {
  // h1's rail-0 uplink to its second router is slow both ways; one
  // connection towards h1 through it ran out of RC retries. The link is
  // named, and the failed pair is its, not a fault of its own.
  auto m = mesh();
  size_t failed = 0;
  for (size_t i = 0; i < m.size(); i++) {
    auto& x = m[i];
    if (x.rail != 0) continue;
    if ((x.src == 0 && x.router == "192.168.0.6") || (x.dst == 0 && x.sport == 0xC002)) x.mbps = 2;
    if (x.src == 2 && x.dst == 0 && x.sport == 0xC002) x.error = "transport retry counter exceeded", failed = i;
  }
  Judged j = judge_backend(m, Thresholds{});
  ASSERT_EQ(j.links.size(), 1u);
  EXPECT_EQ(j.links[0].router, "192.168.0.6");
  EXPECT_EQ(j.bw[failed], Status::pass);
  EXPECT_NE(j.note[failed].find("failed, probably down the link from"), std::string::npos)
      << j.note[failed];
  Node n = judge({host(), host(), host(), host()}, {counters(), counters(), counters(), counters()}, m);
  EXPECT_EQ(bad_leaves(n),
            std::vector<std::string>{"fleet/Back-end network/rail 0/leaf-spine links/h1's leaf <-> 192.168.0.6"});
}

TEST(AuditVerdict, AHostSlowThroughEveryRouterIsItsOwnLinkNotASpines) {
  auto m = mesh();
  for (auto& x : m)
    if (x.rail == 1 && x.src == 2) x.mbps = 4;
  Judged j = judge_backend(m, Thresholds{});
  ASSERT_EQ(j.links.size(), 1u);
  EXPECT_EQ(j.links[0].host, 2);
  EXPECT_EQ(j.links[0].rail, 1);
  EXPECT_EQ(j.links[0].router, "");
  Node n = judge({host(), host(), host(), host()}, {counters(), counters(), counters(), counters()}, m);
  EXPECT_EQ(bad_leaves(n), std::vector<std::string>{"fleet/Back-end network/rail 1/host links/h3's rxe1 <-> its leaf"});
}

TEST(AuditVerdict, OneSlowPairIsThatPairAlone) {
  auto m = mesh();
  for (auto& x : m)
    if (x.rail == 1 && x.src == 2 && x.dst == 3) x.mbps = 4;
  Judged j = judge_backend(m, Thresholds{});
  EXPECT_TRUE(j.links.empty());
  size_t failed = 0;
  for (size_t i = 0; i < m.size(); i++) failed += j.bw[i] == Status::fail;
  EXPECT_EQ(failed, 2u);  // h3 -> h4 through both routers
}

TEST(AuditVerdict, AFailedConnectionFailsItsPair) {
  auto m = mesh();
  m[5].error = "write completed with transport retry counter exceeded";
  Node n =
      judge({host(), host(), host(), host()}, {counters(), counters(), counters(), counters()}, m);
  auto bad = bad_leaves(n);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(bad[0].find("rail 0/pairs/h1 -> h4 via 192.168.0.6"), std::string::npos) << bad[0];
  EXPECT_EQ(exit_code(n.status), 2);
}

TEST(AuditVerdict, AHostThatCannotReachAnotherFailsOnTheFrontEnd) {
  json cut = host();
  cut["reach"] = {true, true, false, true};
  json silent = host();
  silent["reach"] = nullptr;
  Node n = judge({host(), cut, host(), silent}, {counters(), counters(), counters(), counters()}, mesh());
  EXPECT_EQ(bad_leaves(n), (std::vector<std::string>{"fleet/Front-end network/h2", "fleet/Front-end network/h4"}));
  EXPECT_EQ(n.children[2].children[1].detail, "cannot reach h3");
}
