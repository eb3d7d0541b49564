// Bytes from outside the process that are not UTF-8 (environment, paths,
// reports): every text shunt writes from them stays valid, nothing throws.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include "core/event_log.h"
#include "core/json_text.h"
#include "interpose/stats_sources.h"
#include "telemetry/metrics.h"
#include "telemetry/prom.h"
#include "telemetry/stats_file.h"

namespace shunt {
namespace {
using nlohmann::json;

const std::string kFffd = "\xEF\xBF\xBD";

bool is_utf8(const std::string& s) {
  for (std::string_view v(s); !v.empty();) {
    size_t n = utf8_sequence(v);
    if (!n) return false;
    v.remove_prefix(n);
  }
  return true;
}

TEST(JsonText, ToTextWritesBytesThatAreNotUtf8AsReplacementCharacters) {
  json j = {{"job", "a\xff\xfe" "b"}};
  EXPECT_THROW(j.dump(), json::type_error);  // what to_text exists for
  EXPECT_EQ(to_text(j), "{\"job\":\"a" + kFffd + kFffd + "b\"}");
  EXPECT_EQ(to_text(json({{"k", 1}}), 2), json({{"k", 1}}).dump(2));
}

TEST(JsonText, ValidUtf8KeepsWellFormedTextAndReplacesTheRest) {
  EXPECT_EQ(valid_utf8("plain"), "plain");
  EXPECT_EQ(valid_utf8("\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), "\xC3\xA9t\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(valid_utf8("\xff"), kFffd);
  EXPECT_EQ(valid_utf8("a\xC3"), "a" + kFffd);                // cut sequence
  EXPECT_EQ(valid_utf8("\xC0\xAF"), kFffd + kFffd);           // overlong '/'
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // a surrogate
  EXPECT_EQ(valid_utf8("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
  EXPECT_EQ(valid_utf8(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(JsonText, TheProcessSnapshotIsUtf8WhateverTheJobIdsBytes) {
  // The launcher's job id is read at each snapshot; a member's report and
  // the agent's answers are dumps of this snapshot.
  ASSERT_EQ(setenv("SLURM_JOB_ID", "job\xff\xfe", 1), 0);
  ASSERT_EQ(setenv("RANK", "\x80", 1), 0);
  register_stats_sources();  // as libshunt.so's constructor does
  json s = telemetry::stats_json();
  unsetenv("SLURM_JOB_ID");
  unsetenv("RANK");
  EXPECT_NO_THROW(s.dump());
  EXPECT_EQ(s["job"], "job" + kFffd + kFffd);
  EXPECT_EQ(s["rank"], kFffd);
}

TEST(JsonText, MetricLabelValuesAreUtf8) {
  telemetry::Exposition x;
  x.family("m", "gauge", "help \xff");
  x.add("m", {{"job", "j\xfe"}}, uint64_t{1});
  std::string t = x.text();
  EXPECT_TRUE(is_utf8(t)) << t;
  EXPECT_NE(t.find("m{job=\"j" + kFffd + "\"} 1\n"), std::string::npos) << t;
}

TEST(JsonText, EventFieldsThatAreNotUtf8StayParsableJson) {
  char buf[256];
  size_t n = telemetry::format_fields(buf, sizeof buf, {{"path", "/tmp/\xff.log"}, {"ok", "\xC3\xA9"}});
  json j = json::parse("{" + std::string(buf, n) + "}", nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << std::string(buf, n);
  EXPECT_EQ(j["path"], "/tmp/" + kFffd + ".log");
  EXPECT_EQ(j["ok"], "\xC3\xA9");
}

TEST(JsonText, MetricsRenderReportsOfAnyShapeWithoutThrowing) {
  // Fields of the wrong type or missing, where a report has numbers,
  // objects and arrays: each member is rendered as far as it makes sense.
  telemetry::HostView v;
  v.members = {
      {"1", {{"verbs", {{"calls", {{"ibv_post_send", "x"}}}, {"qps", {{{"destroyed", "yes"}, {"send_wrs", {{"SEND", -1}}}}}},
                        {"devices", {json::object(), {{"untracked_qps", 5}}}}}},
             {"sockets", {{{"open", "yes"}, {"role", 5}, {"tx_bytes", -3.0}}, 7}},
             {"bundles", {{{"paths", {{{"up", 1}, {"share", "x"}, {"queue", {{"excess_ns", "x"}}}}}}}}},
             {"events", {{"failover", "x"}, {"other", 1e300}}},
             {"final", "no"},
             {"job", 5}}},
      {"2", 5},
      {"3", {{"verbs", 5}, {"sockets", "x"}, {"bundles", {{"paths", 5}}}, {"events", json::array()}}}};
  v.peers = {5, {{"peer", "p"}, {"clock", 5}, {"paths", {5, {{"rail", "x"}, {"fwd_p50_ns", "x"}}}}}};
  std::string t;
  ASSERT_NO_THROW(t = telemetry::render_metrics(v));
  EXPECT_NE(t.find("shunt_processes{state=\"running\"} 3"), std::string::npos) << t;
  EXPECT_NE(t.find("shunt_events_total{type=\"other\"} 18446744073709551615"), std::string::npos) << t;
  ASSERT_NO_THROW(telemetry::bundle_paths_view(v));
  ASSERT_NO_THROW(telemetry::host_view_from({{"agent_pid", "x"}, {"uptime_s", "y"}, {"members", 5}}));
}

}  // namespace
}  // namespace shunt

TEST(JsonText, NestingCountsBracketsOutsideStrings) {
  EXPECT_EQ(shunt::json_nesting("5"), 0);
  EXPECT_EQ(shunt::json_nesting(R"({"a":[1,{"b":2}]})"), 3);
  EXPECT_EQ(shunt::json_nesting(R"({"a":"[[[{{\"[["})"), 1);
  EXPECT_EQ(shunt::json_nesting(std::string(100000, '[') + std::string(100000, ']')), 100000);
}
