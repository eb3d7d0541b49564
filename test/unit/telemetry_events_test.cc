// The event ring (many producers, one consumer, never blocking) and the
// event field formatter.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/event_log.h"
#include "core/event_ring.h"

namespace shunt::telemetry {
namespace {

TEST(TelemetryRing, FullRingRefusesThenDrainsInOrder) {
  MpscRing<int, 4> r;
  for (int i = 0; i < 4; i++) EXPECT_TRUE(r.push([i](int& v) { v = i; }));
  EXPECT_FALSE(r.push([](int& v) { v = 99; }));
  for (int i = 0; i < 4; i++) EXPECT_TRUE(r.pop([i](const int& v) { EXPECT_EQ(v, i); }));
  EXPECT_FALSE(r.pop([](const int&) {}));
  EXPECT_TRUE(r.push([](int& v) { v = 5; }));
  EXPECT_TRUE(r.pop([](const int& v) { EXPECT_EQ(v, 5); }));
}

TEST(TelemetryRing, ManyProducersLoseNothingAccepted) {
  struct E {
    int producer;
    uint64_t seq;
  };
  MpscRing<E, 256> r;
  constexpr int kProducers = 4;
  constexpr uint64_t kEach = 50000;
  std::atomic<uint64_t> refused{0};
  std::atomic<int> done{0};
  std::vector<std::thread> ts;
  for (int p = 0; p < kProducers; p++)
    ts.emplace_back([&, p] {
      for (uint64_t i = 0; i < kEach; i++)
        if (!r.push([&](E& e) { e = {p, i}; })) refused++;
      done++;
    });
  uint64_t got = 0;
  std::vector<int64_t> last(kProducers, -1);
  bool ordered = true;
  auto take = [&](const E& e) {
    got++;
    if (static_cast<int64_t>(e.seq) <= last[e.producer]) ordered = false;
    last[e.producer] = static_cast<int64_t>(e.seq);
  };
  while (done.load() < kProducers) r.pop(take);
  while (r.pop(take)) {
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(got + refused.load(), kProducers * kEach);
  EXPECT_TRUE(ordered) << "a producer's entries came out of order";
  EXPECT_GT(got, 0u);
}

TEST(TelemetryEvents, FieldsAreValidJson) {
  char buf[256];
  std::string s = "quote\" back\\ nl\n";
  size_t n = format_fields(buf, sizeof buf, {{"a", s}, {"b", 42}, {"c", 1.5}, {"d", true}, {"e", -7LL}});
  auto j = nlohmann::json::parse("{" + std::string(buf, n) + "}");
  EXPECT_EQ(j["a"], s);
  EXPECT_EQ(j["b"], 42);
  EXPECT_EQ(j["c"], 1.5);
  EXPECT_EQ(j["d"], true);
  EXPECT_EQ(j["e"], -7);
}

TEST(TelemetryEvents, LongFieldsAreCutAtAWholeField) {
  char buf[64];
  std::string big(100, 'x');
  size_t n = format_fields(buf, sizeof buf, {{"a", 1}, {"big", big}, {"c", 2}});
  auto j = nlohmann::json::parse("{" + std::string(buf, n) + "}");
  EXPECT_EQ(j.size(), 1u);
  EXPECT_EQ(j["a"], 1);
}

TEST(TelemetryEvents, KnownTypesAreCounted) {
  uint64_t before = event_count("failover"), other = event_count("something_new");
  event("failover", {{"from", "rail0"}});
  event("something_new");
  EXPECT_EQ(event_count("failover"), before + 1);
  EXPECT_EQ(event_count("something_new"), other + 1);  // counted as "other"
  EXPECT_EQ(event_counts()["failover"], before + 1);
}

}  // namespace
}  // namespace shunt::telemetry
