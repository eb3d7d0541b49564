// Workload diagnosis (telemetry/diagnose.h) on synthetic looks: per pair
// bytes and busy time each second, the route each pair's source port took,
// and the probes' queues.
#include <gtest/gtest.h>

#include <random>

#include "telemetry/diagnose.h"

using namespace shunt::telemetry;
using nlohmann::json;

namespace {
// A host 10.0.0.1 with pairs to three peers, each on one spine.
struct Job {
  struct Q {
    std::string peer, spine;
    double rate = 1000;  // bytes per busy ms
    double busy = 600;   // busy ms per second
    uint64_t bytes = 0, busy_ms = 0;
  };
  std::vector<Q> qs;
  std::mt19937 rng{7};
  int64_t now = 0;
  Diagnoser d;
  std::vector<RouteQueue> queues;
  std::vector<json> events;
  Job() {
    qs.push_back({"10.0.0.2", "s1"});
    qs.push_back({"10.0.0.3", "s2"});
    qs.push_back({"10.0.0.4", "s1"});
    qs.push_back({"10.0.0.5", "s2"});
  }
  // With these probe queues, `looks` seconds on: the first event (null: none).
  json first_after(std::vector<RouteQueue> q, int looks = 8) {
    queues = std::move(q);
    for (int s = 0; s < looks; s++) second();
    return events.empty() ? json() : events.front();
  }
  // One second: each pair busy for about `busy` ms at about `rate` (noise: 25%).
  void second() {
    now += 1000;
    std::uniform_real_distribution<double> n(0.75, 1.25);
    std::vector<QpLook> looks;
    int i = 0;
    for (auto& q : qs) {
      const double busy = q.busy * n(rng);
      q.busy_ms += static_cast<uint64_t>(busy);
      q.bytes += static_cast<uint64_t>(busy * q.rate * n(rng));
      looks.push_back({"1/rxe0/" + std::to_string(i++), "10.0.0.1", q.peer, q.bytes, q.busy_ms, {{q.spine, q.bytes}}});
    }
    d.look(now, looks, queues);
    for (auto& e : d.take_changes()) events.push_back(e);
  }
};
}  // namespace

TEST(Diagnose, NoFaultNoAlarmOverTenMinutesOfNoise) {
  Job j;
  for (int s = 0; s < 600; s++) j.second();
  EXPECT_TRUE(j.events.empty()) << j.events.front().dump();
  EXPECT_EQ(j.d.view()["state"], "healthy");
}

TEST(Diagnose, AJobThatWaitsLongerIsNotSlow) {
  Job j;
  for (int s = 0; s < 20; s++) j.second();
  for (auto& q : j.qs) q.busy = 150;  // steps come further apart: less busy, same rate while busy
  for (int s = 0; s < 60; s++) j.second();
  EXPECT_TRUE(j.events.empty());
}

TEST(Diagnose, ASlowSpineIsBlamedAsThatLinkAndClearedWhenHealed) {
  Job j;
  for (int s = 0; s < 20; s++) j.second();
  ASSERT_EQ(j.d.view()["state"], "healthy");
  for (auto& q : j.qs)
    if (q.spine == "s2") q.rate /= 3;
  j.queues = {{"10.0.0.3", "s2", 4e6, true}, {"10.0.0.2", "s1", 1e4, false}};
  int found = -1;
  for (int s = 1; s <= 10 && found < 0; s++) {
    j.second();
    if (!j.events.empty()) found = s;
  }
  ASSERT_GT(found, 0) << "no slowdown within 10 s";
  EXPECT_LE(found, 5);
  const json& e = j.events.front();
  EXPECT_EQ(e["event"], "slowdown");
  EXPECT_EQ(e["cause"], "link");
  EXPECT_EQ(e["name"], "10.0.0.1 ~ s2") << e.dump();
  EXPECT_EQ(e["confidence"], "high");
  EXPECT_EQ(e["pairs"].size(), 2u);
  EXPECT_LT(e["worst_factor"].get<double>(), 0.5);
  for (auto& q : j.qs)
    if (q.spine == "s2") q.rate *= 3;
  j.queues.clear();
  int ended = -1;
  for (int s = 1; s <= 10 && ended < 0; s++) {
    j.second();
    if (j.events.back()["event"] == "slowdown_end") ended = s;
  }
  ASSERT_GT(ended, 0) << "not healthy again within 10 s";
  EXPECT_LE(ended, 5);
  EXPECT_EQ(j.events.size(), 2u) << "one slowdown, one end: " << j.events.back().dump();
  EXPECT_EQ(j.d.view()["state"], "healthy");
}

TEST(Diagnose, EveryPairOfOnePeerSlowOnEverySpineBlamesThatHost) {
  Job j;
  j.qs.push_back({"10.1.0.3", "s1"});  // the same peer host as 10.0.0.3, on its other rail
  j.d.set_host("h3", {"10.0.0.3", "10.1.0.3"});
  for (int s = 0; s < 20; s++) j.second();
  for (auto& q : j.qs)
    if (q.peer == "10.0.0.3" || q.peer == "10.1.0.3") q.rate /= 4;
  for (int s = 0; s < 6; s++) j.second();
  ASSERT_FALSE(j.events.empty());
  EXPECT_EQ(j.events.front()["cause"], "host");
  EXPECT_EQ(j.events.front()["name"], "h3");
}

// A host that is short of CPU delays the probes on every route to it:
// the queue is the host's, not a link's.
TEST(Diagnose, APeerWhoseRoutesAllQueueIsBlamedNotItsLink) {
  auto blamed = [](bool other_route_queues) {
    Job j;
    j.d.set_host("h3", {"10.0.0.3", "10.1.0.3"});
    for (int s = 0; s < 20; s++) j.second();
    j.qs[1].rate /= 3;  // 10.0.0.3, via s2
    return j.first_after({{"10.0.0.3", "s2", 3e6, true}, {"10.1.0.3", "s1", 3e6, other_route_queues},
                          {"10.0.0.2", "s1", 1e4, false}, {"10.0.0.5", "s2", 1e4, false}});
  };
  const json host = blamed(true);
  EXPECT_EQ(host.value("cause", ""), "host") << host.dump();
  EXPECT_EQ(host.value("name", ""), "h3");
  // The same slow pair where only its own route queues: that link.
  const json link = blamed(false);
  EXPECT_EQ(link.value("cause", ""), "link") << link.dump();
  EXPECT_EQ(link.value("name", ""), "10.0.0.3 ~ s2");
}

// This host's own uplink to a spine that all its pairs happen to take:
// every pair slows alike, which alone would pass for a starved guest; the
// probes on that spine's routes queue and on the other's do not.
TEST(Diagnose, OwnUplinkThatEveryPairTakesIsBlamedByItsProbes) {
  Job j;
  for (auto& q : j.qs) q.spine = "s1";
  for (int s = 0; s < 20; s++) j.second();
  for (auto& q : j.qs) q.rate /= 3;
  const json e = j.first_after({{"10.0.0.2", "s1", 2e8, true}, {"10.0.0.3", "s1", 2e8, true},
                                {"10.0.0.2", "s2", 1e4, false}, {"10.0.0.3", "s2", 1e4, false}});
  EXPECT_EQ(e.value("cause", ""), "link") << e.dump();
  EXPECT_EQ(e.value("name", ""), "10.0.0.1 ~ s1");
}

// This host's uplink to a spine, with only one of the pairs through it
// slow so far: the probes through that spine queue towards two hosts, so
// it is this end of the route, not the slow pair's peer's.
TEST(Diagnose, ProbesQueueingTowardsTwoHostsThroughOneSpineNameTheUplink) {
  Job j;
  for (int s = 0; s < 20; s++) j.second();
  j.qs[1].rate /= 4;  // 10.0.0.3 via s2; 10.0.0.5 via s2 not (yet) slow
  const json e = j.first_after({{"10.0.0.3", "s2", 2e8, true}, {"10.0.0.5", "s2", 2e8, true},
                                {"10.0.0.3", "s1", 1e4, false}, {"10.0.0.2", "s1", 1e4, false}});
  EXPECT_EQ(e.value("cause", ""), "link") << e.dump();
  EXPECT_EQ(e.value("name", ""), "10.0.0.1 ~ s2");
}

// Every pair of this host at once is what a guest starved of CPU for a
// while looks like from inside: not blamed for a few seconds; blamed on
// this host when it lasts (a hog, its NIC, its PCIe link).
TEST(Diagnose, EveryPairOfThisHostSlowIsThisHostOnlyWhenItLasts) {
  Job j;
  j.d.set_host("h1", {"10.0.0.1"});
  for (int s = 0; s < 20; s++) j.second();
  for (auto& q : j.qs) q.rate /= 3;
  for (int s = 0; s < 6; s++) j.second();
  for (auto& q : j.qs) q.rate *= 3;
  for (int s = 0; s < 10; s++) j.second();
  EXPECT_TRUE(j.events.empty()) << "a 6 s dip: " << j.events.front().dump();
  for (auto& q : j.qs) q.rate /= 3;
  int found = -1;
  for (int s = 1; s <= 20 && found < 0; s++) {
    j.second();
    if (!j.events.empty()) found = s;
  }
  ASSERT_GT(found, 0);
  EXPECT_LE(found, 15);
  EXPECT_EQ(j.events.front()["cause"], "host") << j.events.front().dump();
  EXPECT_EQ(j.events.front()["name"], "h1");
}

TEST(Diagnose, IdlePairsAreNeitherSlowNorCounted) {
  Job j;
  for (int s = 0; s < 20; s++) j.second();
  for (auto& q : j.qs) q.busy = 0;
  for (int s = 0; s < 30; s++) j.second();
  EXPECT_TRUE(j.events.empty());
  const json v = j.d.view();  // (a range-for over view()["pairs"] read the freed temporary)
  for (const auto& p : v["pairs"]) EXPECT_TRUE(p["rate_Bps"].is_null());
}

TEST(Diagnose, LooksFromMembersReports) {
  json members = {
      {"12",
       {{"verbs",
         {{"qps",
           {{{"device", "rxe0"}, {"qpn", 17}, {"local", "10.0.0.1"}, {"peer", "10.0.0.2"}, {"send_bytes", 5000},
             {"busy_ms", 40}, {"last_steps", 3},
             {"bundle", {{"primary", {{"router", "s1"}, {"bytes", 3000}}}, {"paths", {{{"router", "s2"}, {"bytes", 2000}}}}}}},
            {{"device", "rxe0"}, {"qpn", 18}, {"shadow_of", 17}, {"local", "10.0.0.1"}, {"peer", "10.0.0.2"}},
            {{"device", "rxe0"}, {"qpn", 19}, {"destroyed", true}, {"local", "10.0.0.1"}, {"peer", "10.0.0.2"}},
            {{"device", "rxe0"}, {"qpn", 20}}}},
          {"step_ends", 9}}}}},
      {"13", {{"final", true}, {"verbs", {{"qps", json::array()}}}}},
      {"14", "not a report"}};
  auto looks = qp_looks(members);
  ASSERT_EQ(looks.size(), 1u);
  EXPECT_EQ(looks[0].key, "12/rxe0/17");
  EXPECT_EQ(looks[0].bytes, 5000u);
  EXPECT_EQ(looks[0].busy_ms, 40u);
  ASSERT_EQ(looks[0].routes.size(), 2u);
  EXPECT_EQ(looks[0].routes[1].first, "s2");
  EXPECT_EQ(looks[0].last_steps, 3u);
  EXPECT_EQ(looks[0].step_ends, 9u);
}

// Which pairs sit on the steps' critical path: each pair's share of the
// recent steps that it ended last (its QP had work at the process's last
// busy look of the step); the blamed pairs carry it too.
TEST(Diagnose, PairsThatEndTheStepsLastAreOnTheCriticalPath) {
  Job j;
  uint64_t ends = 0;
  std::vector<uint64_t> last(j.qs.size(), 0);
  auto second = [&](int slow_one) {
    j.now += 1000;
    std::vector<QpLook> looks;
    ends += 2;  // two steps a second
    for (size_t i = 0; i < j.qs.size(); i++) {
      auto& q = j.qs[i];
      q.busy_ms += 600;
      q.bytes += static_cast<uint64_t>(600 * q.rate);
      // Without a fault the steps end on any pair in turn; the slow one ends them all.
      if (slow_one >= 0 ? static_cast<int>(i) == slow_one : (ends / 2) % j.qs.size() == i) last[i] += 2;
      looks.push_back({"1/rxe0/" + std::to_string(i), "10.0.0.1", q.peer, q.bytes, q.busy_ms, {{q.spine, q.bytes}}, ends, last[i]});
    }
    j.d.look(j.now, looks, j.queues);
  };
  for (int s = 0; s < 20; s++) second(-1);
  for (const auto& p : j.d.view()["pairs"]) EXPECT_NEAR(p["last_share"].get<double>(), 0.25, 0.1) << p.dump();
  j.qs[1].rate /= 3;
  for (int s = 0; s < 15; s++) second(1);
  json v = j.d.view();
  for (const auto& p : v["pairs"]) EXPECT_EQ(p["last_share"].get<double>(), p["peer"] == "10.0.0.3" ? 1.0 : 0.0) << p.dump();
  ASSERT_TRUE(v["slowdown"].is_object()) << v.dump();
  EXPECT_EQ(v["slowdown"]["pairs"][0]["last_share"], 1.0);
  // Pairs of a process with no steps (never all idle) have none.
  Diagnoser d;
  d.look(1000, {{"k", "10.0.0.1", "10.0.0.2", 100, 10, {}}}, {});
  d.look(2000, {{"k", "10.0.0.1", "10.0.0.2", 200, 20, {}}}, {});
  EXPECT_TRUE(d.view()["pairs"][0]["last_share"].is_null());
}
