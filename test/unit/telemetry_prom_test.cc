// The exposition writer and the host view renderer, on synthetic reports.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "agent/agent_services.h"
#include "clocksync/path_view.h"
#include "telemetry/metrics.h"
#include "telemetry/prom.h"
#include "telemetry/retired.h"

namespace shunt::telemetry {
namespace {
using nlohmann::json;

TEST(TelemetryProm, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(escape_help("x\\y\nz\""), "x\\\\y\\nz\"");
}

TEST(TelemetryProm, FormatsSpecialValues) {
  EXPECT_EQ(format_value(1.5), "1.5");
  EXPECT_EQ(format_value(0.0 / 0.0), "NaN");
  EXPECT_EQ(format_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(format_value(-1.0 / 0.0), "-Inf");
}

TEST(TelemetryProm, NamesAreChecked) {
  EXPECT_TRUE(valid_metric_name("shunt_x:y_total"));
  EXPECT_FALSE(valid_metric_name("9x"));
  EXPECT_FALSE(valid_metric_name("a-b"));
  EXPECT_TRUE(valid_label_name("peer"));
  EXPECT_FALSE(valid_label_name("a:b"));
  EXPECT_FALSE(valid_label_name("__name__"));
}

TEST(TelemetryProm, FamiliesKeepOrderAndCountersStayExact) {
  Exposition x;
  x.family("b_total", "counter", "B.");
  x.family("a", "gauge", "A.");
  EXPECT_TRUE(x.add("a", {{"k", "v"}}, 2.5));
  EXPECT_TRUE(x.add("b_total", {}, uint64_t{18446744073709551615ULL}));
  EXPECT_FALSE(x.add("undeclared", {}, 1));
  EXPECT_EQ(x.text(),
            "# HELP b_total B.\n# TYPE b_total counter\nb_total 18446744073709551615\n"
            "# HELP a A.\n# TYPE a gauge\na{k=\"v\"} 2.5\n");
}

json member(const char* rank, uint64_t tx) {
  return {{"mode", "observe"},
          {"job", "j"},
          {"rank", rank},
          {"events", {{"failover", 2}, {"path_down", 1}}},
          {"verbs",
           {{"calls", {{"ibv_create_qp", 1}}},
            {"qps",
             {{{"device", "rxe0"},
               {"qpn", 17},
               {"type", "RC"},
               {"destroyed", false},
               {"send_bytes", tx},
               {"recv_bytes", 5},
               {"recv_wrs", 1},
               {"completions", 3},
               {"send_post_errors", 0},
               {"recv_post_errors", 0},
               {"send_wrs", {{"RDMA_WRITE", 4}}},
               {"errors", {{"retry counter exceeded", 1}}}}}},
            {"devices", json::array()}}},
          // the same connection seen twice (a reused fd): summed into one series
          {"sockets",
           {{{"role", "client"}, {"local", "10.0.0.1:5"}, {"peer", "10.0.0.2:6"}, {"tx_bytes", 100}, {"rx_bytes", 7}, {"open", false}},
            {{"role", "client"}, {"local", "10.0.0.1:5"}, {"peer", "10.0.0.2:6"}, {"tx_bytes", 11}, {"rx_bytes", 0}, {"open", true}}}}};
}

TEST(TelemetryMetrics, MergesMembersWithExactValues) {
  HostView v;
  v.members["100"] = member("0", 4096);
  v.members["101"] = member("1", 8192);
  v.members["101"]["final"] = true;
  v.peers = json::parse(R"([{"peer":"b","clock":{"valid":true,"offset_ns":1500,"bound_ns":200,"drift_ppb":3,"half_rtt_ns":1000,"age_ns":0},
    "paths":[{"rail":0,"local":"10.0.0.1","remote":"10.0.0.2","alive":true,"fwd_p50_ns":400,"fwd_p99_ns":900,
              "rev_p50_ns":600,"rev_p99_ns":-1,"fwd_loss":0,"rev_loss":0.5,"sent":10,"received":9}]}])");
  std::string t = render_metrics(v);
  auto has = [&](const std::string& line) { return t.find("\n" + line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(shunt_qp_tx_bytes_total{shunt_job="j",rank="0",device="rxe0",type="RC"} 4096)")) << t;
  EXPECT_TRUE(has(R"(shunt_qp_tx_bytes_total{shunt_job="j",rank="1",device="rxe0",type="RC"} 8192)"));
  EXPECT_TRUE(has(R"(shunt_qp_tx_wrs_total{shunt_job="j",rank="0",device="rxe0",type="RC",opcode="RDMA_WRITE"} 4)"));
  EXPECT_TRUE(has(R"(shunt_qp_errors_total{shunt_job="j",rank="0",device="rxe0",type="RC",status="retry counter exceeded"} 1)"));
  EXPECT_TRUE(has(R"(shunt_socket_tx_bytes_total{shunt_job="j",rank="0",role="client",local="10.0.0.1",remote="10.0.0.2"} 111)"));
  EXPECT_TRUE(has(R"(shunt_failovers_total{shunt_job="j",rank="0"} 2)"));
  EXPECT_TRUE(has(R"(shunt_processes{state="exited"} 1)"));
  EXPECT_TRUE(has(R"(shunt_sockets{state="closed",role="client"} 2)"));
  EXPECT_TRUE(has(R"(shunt_path_up{peer="b",rail="0",path="10.0.0.1->10.0.0.2"} 1)"));
  EXPECT_TRUE(has(R"(shunt_path_rtt_seconds{peer="b",rail="0",path="10.0.0.1->10.0.0.2"} 1e-06)"));
  // Path bytes: both members' sockets between the path's two addresses.
  EXPECT_TRUE(has(R"(shunt_path_tx_bytes_total{peer="b",rail="0",path="10.0.0.1->10.0.0.2"} 222)"));
  EXPECT_TRUE(has(R"(shunt_peer_clock_offset_seconds{peer="b"} 1.5e-06)"));
  EXPECT_TRUE(has(R"(shunt_build_info{version=")" SHUNT_VERSION R"("} 1)"));
  // Exited processes the agent let go still count as exited, through the
  // agent's answer too.
  v.exited_dropped = 7;
  t = render_metrics(host_view_from(host_view_json(v)));
  EXPECT_TRUE(has(R"(shunt_processes{state="exited"} 8)")) << t;
}

// Older closed sockets come summed ("closed_sockets"): they count as many
// sockets as they sum, and their bytes stay in the connection and path totals.
TEST(TelemetryMetrics, SummedClosedSocketsKeepCountsAndBytes) {
  HostView v;
  v.members["100"] = member("0", 1);
  v.members["100"]["closed_sockets"] = json::parse(R"([
    {"role":"client","local":"10.0.0.1:*","peer":"10.0.0.2:6","sockets":40,"upgraded":40,"tx_bytes":4000,"rx_bytes":400,"accepts":0},
    {"role":"listener","local":"10.0.0.1:7","peer":"","sockets":2,"upgraded":2,"tx_bytes":0,"rx_bytes":0,"accepts":9}])");
  v.peers = json::parse(R"([{"peer":"b","clock":{"valid":false},
    "paths":[{"rail":0,"local":"10.0.0.1","remote":"10.0.0.2","alive":true}]}])");
  std::string t = render_metrics(v);
  auto has = [&](const std::string& line) { return t.find("\n" + line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(shunt_sockets{state="closed",role="client"} 41)")) << t;
  EXPECT_TRUE(has(R"(shunt_sockets{state="closed",role="listener"} 2)"));
  EXPECT_TRUE(has(R"(shunt_socket_tx_bytes_total{shunt_job="j",rank="0",role="client",local="10.0.0.1",remote="10.0.0.2"} 4111)"));
  EXPECT_TRUE(has(R"(shunt_socket_accepts_total{shunt_job="j",rank="0",local="10.0.0.1"} 9)"));
  EXPECT_TRUE(has(R"(shunt_path_tx_bytes_total{peer="b",rail="0",path="10.0.0.1->10.0.0.2"} 4111)"));
}

// Every counter sample of an exposition (a histogram's too): series -> value.
std::map<std::string, std::string> counters(const std::string& text) {
  std::map<std::string, std::string> out;
  std::set<std::string> counter_families;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream w(line.substr(7));
      std::string name, type;
      w >> name >> type;
      if (type == "counter" || type == "histogram") counter_families.insert(name);
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    const std::string series = line.substr(0, sp);
    std::string family = series.substr(0, series.find('{'));
    for (const char* part : {"_bucket", "_sum", "_count"})
      if (family.ends_with(part) && counter_families.count(family.substr(0, family.size() - strlen(part))))
        family.resize(family.size() - strlen(part));
    if (counter_families.count(family)) out[series] = line.substr(sp + 1);
  }
  return out;
}

// An exited process whose report the agent lets go (beyond its 256) shares
// its series with the job's other processes of the same rank (data loader
// workers, a restarted rank): its counters stay in them through
// fold_exited, so no counter goes backwards (Prometheus would read a reset),
// and its gauges go with it.
TEST(TelemetryMetrics, CountersStayWhenAnExitedProcessIsLetGo) {
  HostView v;
  v.members["100"] = member("0", 4096);
  json gone = member("0", 8192);  // same job and rank, exited
  gone["final"] = true;
  gone["replays"] = 3;
  gone["events_dropped"] = 2;
  // Transfer times of the same pair in both: one histogram.
  for (json* m : {&v.members["100"], &gone}) {
    json& q = (*m)["verbs"]["qps"][0];
    q["local"] = "10.0.0.1";
    q["peer"] = "10.0.0.2";
    q["transfers"] = {0, 1, 2, 0, 0, 3, 0, 0, 0, 0, 1};
    q["transfer_ms"] = 20000;
  }
  gone["verbs"]["devices"] = json::parse(R"([{"device":"rxe0","untracked_qps":{"send_bytes":70,"completions":2}}])");
  gone["sockets"].push_back(json::parse(R"({"role":"client","local":"10.0.0.1:9","peer":"10.0.0.3:6","tx_bytes":500,
    "rx_bytes":50,"open":true,"paths":[{"local":"10.0.0.1","remote":"10.0.0.3","tx_bytes":300,"rx_bytes":30},
    {"local":"10.0.1.1","remote":"10.0.1.3","tx_bytes":200,"rx_bytes":20}]})"));
  gone["closed_sockets"] = json::parse(R"([{"role":"client","local":"10.0.0.1:*","peer":"10.0.0.2:6","sockets":40,
    "tx_bytes":4000,"rx_bytes":400,"accepts":0},{"role":"listener","local":"10.0.0.1:7","peer":"","sockets":2,
    "tx_bytes":0,"rx_bytes":0,"accepts":9}])");
  gone["bundles"] = json::parse(R"([{"qpn":17,"device":"rxe0","state":"up","paths":[
    {"path":"primary","nic":"rxe0","up":true,"carrier":true,"tx_bytes":4096,"fails":1},
    {"path":"0","nic":"rxe1","up":true,"carrier":false,"tx_bytes":65536,"fails":0}]}])");
  gone["closed_bundle_paths"] = json::parse(R"([{"device":"rxe0","nic":"rxe1","path":"0","bundles":2,"tx_bytes":100,"fails":4}])");
  v.members["101"] = gone;
  v.peers = json::parse(R"([{"peer":"b","clock":{"valid":false},"paths":[
    {"rail":0,"local":"10.0.0.1","remote":"10.0.0.2","alive":true},
    {"rail":1,"local":"10.0.1.1","remote":"10.0.1.3","alive":true}]},
    {"peer":"c","clock":{"valid":false},"paths":[{"rail":0,"local":"10.0.0.1","remote":"10.0.0.3","alive":true}]}])");
  const auto before = counters(render_metrics(v));

  fold_exited(v.retired, v.members["101"]);
  v.members.erase("101");
  v.exited_dropped = 1;
  const std::string t = render_metrics(host_view_from(host_view_json(v)));  // through the agent's answer
  const auto after = counters(t);
  EXPECT_EQ(after, before) << t;
  for (const char* series : {R"(shunt_path_tx_bytes_total{peer="c",rail="0",path="10.0.0.1->10.0.0.3"})",
                             R"(shunt_path_tx_bytes_total{peer="b",rail="1",path="10.0.1.1->10.0.1.3"})",
                             R"(shunt_bundle_path_failures_total{shunt_job="j",rank="0",device="rxe0",nic="rxe1",path="0"})",
                             R"(shunt_replays_total{shunt_job="j",rank="0"})",
                             R"(shunt_socket_accepts_total{shunt_job="j",rank="0",local="10.0.0.1"})",
                             R"(shunt_qp_completions_total{shunt_job="j",rank="0",device="rxe0",type="untracked"})",
                             R"(shunt_pair_transfer_seconds_bucket{local="10.0.0.1",peer="10.0.0.2",le="0.5"})",
                             R"(shunt_pair_transfer_seconds_count{local="10.0.0.1",peer="10.0.0.2"})"})
    EXPECT_TRUE(before.count(series)) << series << " is a counter the test means to compare";
  auto has = [&](const std::string& line) { return t.find("\n" + line + "\n") != std::string::npos; };
  EXPECT_TRUE(has(R"(shunt_process_mode{shunt_job="j",rank="0",mode="observe"} 1)")) << "the running one alone";
  EXPECT_TRUE(has(R"(shunt_qps{shunt_job="j",rank="0",state="live"} 1)"));
  EXPECT_TRUE(has(R"(shunt_processes{state="exited"} 1)"));
  EXPECT_TRUE(has(R"(shunt_sockets{state="closed",role="client"} 44)"));
  EXPECT_TRUE(has(R"(shunt_pair_transfer_seconds_bucket{local="10.0.0.1",peer="10.0.0.2",le="0.05"} 6)")) << "cumulative";
  EXPECT_TRUE(has(R"(shunt_pair_transfer_seconds_count{local="10.0.0.1",peer="10.0.0.2"} 14)"));
  EXPECT_TRUE(has(R"(shunt_pair_transfer_seconds_sum{local="10.0.0.1",peer="10.0.0.2"} 40)"));

  // A second one of that rank adds to the same entry.
  fold_exited(v.retired, gone);
  ASSERT_EQ(v.retired.size(), 1u);
  EXPECT_EQ(counters(render_metrics(v))[R"(shunt_replays_total{shunt_job="j",rank="0"})"], "6");
}

// What fold_exited keeps is bounded: entries per job and rank, and the
// keys of each list in them.
TEST(TelemetryMetrics, RetiredCountersAreBounded) {
  json retired;
  for (int r = 0; r < int(kMaxRetired) + 50; r++) fold_exited(retired, member(std::to_string(r).c_str(), 1));
  EXPECT_EQ(retired.size(), kMaxRetired);
  json m = member("0", 1);
  m["sockets"] = json::array();
  for (int i = 0; i < int(kMaxRetiredKeys) + 100; i++)
    m["sockets"].push_back({{"role", "client"}, {"local", "10.0.0.1:5"}, {"peer", "10.9." + std::to_string(i / 250) + "." +
                            std::to_string(i % 250) + ":6"}, {"tx_bytes", 1}});
  json one;
  fold_exited(one, m);
  EXPECT_EQ(one[0]["closed_sockets"].size(), kMaxRetiredKeys);
  // Hostile types read as nothing.
  json odd;
  fold_exited(odd, json::parse(R"({"job":5,"verbs":{"qps":[3,{"device":[]}],"calls":7},"sockets":{"a":1},
    "bundles":[{"paths":"x"}],"events":[1],"replays":-4})"));
  ASSERT_EQ(odd.size(), 1u);
  EXPECT_NO_THROW(render_metrics(HostView{.retired = odd}));
}

TEST(TelemetryMetrics, ABundlesPathsShowWhichIsUpWhichCarriesAndWhatEachSent) {
  HostView v;
  v.members["100"] = member("0", 4096);
  v.members["100"]["bundles"] = json::parse(R"([{"qpn":17,"device":"rxe0","state":"degraded","paths":[
    {"path":"primary","nic":"rxe0","udp_sport":0,"up":false,"carrier":false,"tx_bytes":4096,"fails":1},
    {"path":"0","nic":"rxe1","udp_sport":54943,"up":true,"carrier":true,"tx_bytes":65536,"fails":0}]}])");
  std::string t = render_metrics(v);
  auto has = [&](const std::string& line) { return t.find("\n" + line + "\n") != std::string::npos; };
  // A path on another NIC (a rail) names it.
  const std::string l0 = R"({shunt_job="j",rank="0",device="rxe0",nic="rxe1",path="0"})";
  const std::string lp = R"({shunt_job="j",rank="0",device="rxe0",nic="rxe0",path="primary"})";
  EXPECT_TRUE(has("shunt_bundle_path_up" + lp + " 0")) << t;
  EXPECT_TRUE(has("shunt_bundle_path_failures_total" + lp + " 1"));
  EXPECT_TRUE(has("shunt_bundle_path_carrier" + lp + " 0"));
  EXPECT_TRUE(has("shunt_bundle_path_up" + l0 + " 1"));
  EXPECT_TRUE(has("shunt_bundle_path_carrier" + l0 + " 1"));
  EXPECT_TRUE(has("shunt_bundle_path_tx_bytes_total" + l0 + " 65536"));
  EXPECT_TRUE(has(R"(shunt_bundles{shunt_job="j",rank="0",state="degraded"} 1)"));
}

TEST(TelemetryMetrics, EveryFamilyDeclaredOnceEvenWithoutData) {
  std::string t = render_metrics(HostView{});
  for (const char* f : {"shunt_failovers_total", "shunt_bundles", "shunt_path_up", "shunt_qp_tx_bytes_total"}) {
    std::string type = std::string("# TYPE ") + f + " ";
    size_t at = t.find(type);
    EXPECT_NE(at, std::string::npos) << f;
    EXPECT_EQ(t.find(type, at + 1), std::string::npos) << f;
  }
}

}  // namespace
}  // namespace shunt::telemetry

namespace shunt::telemetry {
namespace {
// shuntctl paths lists every path of the live bundles of running members;
// a member that exited is history, not a path to look at.
TEST(TelemetryMetrics, BundlePathsViewListsEveryPathOfRunningMembers) {
  HostView v;
  v.members["100"] = json::parse(R"({"rank":"0","bundles":[{"qpn":17,"device":"rxe0","state":"degraded","paths":[
    {"path":"primary","udp_sport":0,"up":false,"carrier":false,"tx_bytes":10,"fails":1},
    {"path":"0","udp_sport":54943,"up":true,"carrier":true,"tx_bytes":20,"fails":0}]}]})");
  v.members["101"] = v.members["100"];
  v.members["101"]["final"] = true;
  json p = bundle_paths_view(v);
  ASSERT_EQ(p.size(), 2u) << p.dump();
  EXPECT_EQ(p[0]["pid"], "100");
  EXPECT_EQ(p[0]["path"], "primary");
  EXPECT_EQ(p[0]["up"], false);
  EXPECT_EQ(p[0]["fails"], 1u);
  EXPECT_EQ(p[1]["udp_sport"], 54943u);
  EXPECT_EQ(p[1]["carrier"], true);
  EXPECT_EQ(p[1]["tx_bytes"], 20u);
  EXPECT_EQ(p[1]["qpn"], 17u);
}
}  // namespace
}  // namespace shunt::telemetry

namespace shunt::telemetry {
namespace {
bool has_line(const std::string& t, const std::string& line) { return t.find("\n" + line + "\n") != std::string::npos; }

TEST(TelemetryProm, SamplesWithTheSameLabelsMerge) {
  Exposition x;
  x.family("c_total", "counter", "C.");
  x.family("g", "gauge", "G.");
  x.add("c_total", {{"k", "v"}}, uint64_t{2});
  x.add("c_total", {{"k", "v"}}, uint64_t{3});
  x.add_max("g", {}, 1.5);
  x.add_max("g", {}, 0.5);
  EXPECT_EQ(x.text(), "# HELP c_total C.\n# TYPE c_total counter\nc_total{k=\"v\"} 5\n# HELP g G.\n# TYPE g gauge\ng 1.5\n");
}

// The job's id would be renamed exported_job by a Prometheus whose scrape job
// sets "job"; processes (pids) and QPs come and go and must not make series.
TEST(TelemetryMetrics, SeriesAreByJobRankAndDeviceNotByProcessOrQp) {
  HostView v;
  v.members["100"] = member("0", 4096);
  v.members["102"] = member("0", 1000);  // a forked child of rank 0, its own QP
  v.members["102"]["verbs"]["qps"][0]["qpn"] = 18;
  v.members["100"]["bundles"] = json::parse(R"([{"qpn":17,"device":"rxe0","state":"up","paths":[
    {"path":"0","nic":"rxe0","udp_sport":50001,"up":true,"carrier":false,"tx_bytes":10,"fails":0,"share":0.5}]},
    {"qpn":19,"device":"rxe0","state":"up","paths":[
    {"path":"0","nic":"rxe0","udp_sport":50002,"up":true,"carrier":true,"tx_bytes":20,"fails":1,"share":1.5}]}])");
  std::string t = render_metrics(v);
  EXPECT_TRUE(has_line(t, R"(shunt_qp_tx_bytes_total{shunt_job="j",rank="0",device="rxe0",type="RC"} 5096)")) << t;
  EXPECT_TRUE(has_line(t, R"(shunt_process_mode{shunt_job="j",rank="0",mode="observe"} 2)"));
  EXPECT_TRUE(has_line(t, R"(shunt_bundle_path_up{shunt_job="j",rank="0",device="rxe0",nic="rxe0",path="0"} 2)"));
  EXPECT_TRUE(has_line(t, R"(shunt_bundle_path_carrier{shunt_job="j",rank="0",device="rxe0",nic="rxe0",path="0"} 1)"));
  EXPECT_TRUE(has_line(t, R"(shunt_bundle_path_tx_bytes_total{shunt_job="j",rank="0",device="rxe0",nic="rxe0",path="0"} 30)"));
  EXPECT_TRUE(has_line(t, R"(shunt_bundle_path_share{shunt_job="j",rank="0",device="rxe0",nic="rxe0",path="0"} 1.5)"));
  for (const char* label : {"{job=", ",job=", "pid=", "qpn=", "udp_sport=", "percentile="})
    EXPECT_EQ(t.find(label), std::string::npos) << label;
}

// Summed over a rank's processes, an exited one's last state would count
// as now: its counters stay, its gauges go.
TEST(TelemetryMetrics, AnExitedProcessKeepsItsCountersNotItsGauges) {
  HostView v;
  v.members["100"] = member("0", 1);
  v.members["101"] = member("0", 1);
  v.members["101"]["final"] = true;
  for (const char* pid : {"100", "101"})
    v.members[pid]["bundles"] = json::parse(R"([{"qpn":17,"device":"rxe0","state":"up","paths":[
      {"path":"0","nic":"rxe0","udp_sport":50001,"up":true,"carrier":true,"tx_bytes":10,"fails":1}]}])");
  std::string t = render_metrics(v);
  const std::string l = R"({shunt_job="j",rank="0",device="rxe0",nic="rxe0",path="0"})";
  EXPECT_TRUE(has_line(t, "shunt_bundle_path_up" + l + " 1")) << t;
  EXPECT_TRUE(has_line(t, "shunt_bundle_path_carrier" + l + " 1"));
  EXPECT_TRUE(has_line(t, "shunt_bundle_path_tx_bytes_total" + l + " 20"));
  EXPECT_TRUE(has_line(t, "shunt_bundle_path_failures_total" + l + " 2"));
  EXPECT_TRUE(has_line(t, R"(shunt_bundles{shunt_job="j",rank="0",state="up"} 1)"));
}

// A destroyed QP's bundle comes summed in closed_bundle_paths: its bytes
// and failures stay in the counters, beside the live bundles' own; it has
// no gauge (no path of it is in service or not).
TEST(TelemetryMetrics, ADestroyedQpsBundleKeepsItsCountersNotItsGauges) {
  HostView v;
  v.members["100"] = member("0", 1);
  v.members["100"]["bundles"] = json::parse(R"([{"qpn":17,"device":"rxe0","state":"up","paths":[
    {"path":"0","nic":"rxe0","udp_sport":50001,"up":true,"carrier":true,"tx_bytes":10,"fails":1}]}])");
  v.members["100"]["closed_bundle_paths"] = json::parse(R"([
    {"device":"rxe0","nic":"rxe0","path":"0","bundles":2,"tx_bytes":100,"fails":3},
    {"device":"rxe0","nic":"rxe1","path":"1","bundles":2,"tx_bytes":7,"fails":0}])");
  std::string t = render_metrics(v);
  const std::string l0 = R"({shunt_job="j",rank="0",device="rxe0",nic="rxe0",path="0"})";
  const std::string l1 = R"({shunt_job="j",rank="0",device="rxe0",nic="rxe1",path="1"})";
  EXPECT_TRUE(has_line(t, "shunt_bundle_path_tx_bytes_total" + l0 + " 110")) << t;
  EXPECT_TRUE(has_line(t, "shunt_bundle_path_failures_total" + l0 + " 4"));
  EXPECT_TRUE(has_line(t, "shunt_bundle_path_tx_bytes_total" + l1 + " 7"));
  EXPECT_TRUE(has_line(t, "shunt_bundle_path_up" + l0 + " 1"));
  EXPECT_EQ(t.find("shunt_bundle_path_up" + l1), std::string::npos);
  EXPECT_EQ(t.find("shunt_bundle_paths" + l1), std::string::npos);
}

TEST(TelemetryMetrics, SocketSeriesHaveAddressesWithoutPorts) {
  HostView v;
  v.members["100"] = member("0", 1);
  v.members["100"]["sockets"].push_back(
      {{"role", "client"}, {"local", "10.0.0.1:40001"}, {"peer", "10.0.0.2:6"}, {"tx_bytes", 1000}, {"open", true}});
  std::string t = render_metrics(v);
  EXPECT_TRUE(has_line(t, R"(shunt_socket_tx_bytes_total{shunt_job="j",rank="0",role="client",local="10.0.0.1",remote="10.0.0.2"} 1111)")) << t;
}

TEST(TelemetryMetrics, OneWayDelaysAreAHistogram) {
  HostView v;
  json le = json::array();
  for (size_t i = 0; i < clocksync::kDelayBucketsNs.size(); i++) le.push_back(clocksync::kDelayBucketsNs[i] >= 50e3 ? 3 : 1);
  v.peers = json::array({{{"peer", "b"},
                          {"clock", {{"valid", false}}},
                          {"paths", json::array({{{"rail", 0}, {"local", "10.0.0.1"}, {"remote", "10.0.0.2"}, {"alive", true},
                                                  {"fwd_hist", {{"le", le}, {"count", 4}, {"sum_ns", 2e6}}}}})}}});
  std::string t = render_metrics(v);
  const std::string l = R"(peer="b",rail="0",path="10.0.0.1->10.0.0.2",direction="tx")";
  EXPECT_NE(t.find("# TYPE shunt_path_one_way_delay_seconds histogram\n"), std::string::npos) << t;
  EXPECT_TRUE(has_line(t, "shunt_path_one_way_delay_seconds_bucket{" + l + R"(,le="1e-05"} 1)")) << t;
  EXPECT_TRUE(has_line(t, "shunt_path_one_way_delay_seconds_bucket{" + l + R"(,le="5e-05"} 3)"));
  EXPECT_TRUE(has_line(t, "shunt_path_one_way_delay_seconds_bucket{" + l + R"(,le="+Inf"} 4)"));
  EXPECT_TRUE(has_line(t, "shunt_path_one_way_delay_seconds_sum{" + l + "} 0.002"));
  EXPECT_TRUE(has_line(t, "shunt_path_one_way_delay_seconds_count{" + l + "} 4"));
  EXPECT_EQ(t.find(R"(shunt_path_one_way_delay_seconds_count{peer="b",rail="0",path="10.0.0.1->10.0.0.2",direction="rx"})"),
            std::string::npos)
      << "a direction without delays has no histogram";
}

TEST(TelemetryMetrics, DelayHistogramCountsCumulatively) {
  clocksync::DelayHistogram h;
  h.add(3e3);
  h.add(20e3);
  h.add(-5);  // a clock error: counted, adds nothing to the sum
  EXPECT_EQ(h.le[2], 2u);   // <= 5 us
  EXPECT_EQ(h.le[4], 3u);   // <= 25 us
  EXPECT_EQ(h.count, 3u);
  EXPECT_DOUBLE_EQ(h.sum_ns, 23e3);
}

// After a rail fails, an MPTCP connection's traffic moves to the other
// rail's subflow while the socket's own addresses stay the first subflow's:
// the path bytes follow the subflows, and their count is exported.
TEST(TelemetryMetrics, MptcpBytesGoToThePathsTheirSubflowsUsed) {
  HostView v;
  v.members["100"] = {{"rank", "0"},
                      {"sockets", json::parse(R"([{"role":"client","local":"10.0.0.1:40000","peer":"10.0.0.2:5000",
      "tx_bytes":5000,"rx_bytes":50,"open":true,
      "paths":[{"local":"10.0.0.1","remote":"10.0.0.2","tx_bytes":1000,"rx_bytes":10},
               {"local":"10.1.0.1","remote":"10.1.0.2","tx_bytes":4000,"rx_bytes":40}],
      "mptcp":{"subflow":[{"state":"established"},{"state":"established"}]}}])")}};
  v.peers = json::parse(R"([{"peer":"b","clock":{"valid":false},"paths":[
    {"rail":0,"local":"10.0.0.1","remote":"10.0.0.2","alive":false},
    {"rail":1,"local":"10.1.0.1","remote":"10.1.0.2","alive":true}]}])");
  std::string t = render_metrics(v);
  EXPECT_TRUE(has_line(t, R"(shunt_path_tx_bytes_total{peer="b",rail="0",path="10.0.0.1->10.0.0.2"} 1000)")) << t;
  EXPECT_TRUE(has_line(t, R"(shunt_path_tx_bytes_total{peer="b",rail="1",path="10.1.0.1->10.1.0.2"} 4000)"));
  EXPECT_TRUE(has_line(t, R"(shunt_path_rx_bytes_total{peer="b",rail="1",path="10.1.0.1->10.1.0.2"} 40)"));
  EXPECT_TRUE(has_line(t, R"(shunt_socket_subflows{rank="0"} 2)"));
  json p = paths_view(v);
  EXPECT_EQ(p[1]["tx_bytes"], 4000) << p.dump();
}
}  // namespace
}  // namespace shunt::telemetry

namespace shunt::telemetry {
namespace {
TEST(TelemetryListenAddr, TakesPortAloneIpv6AndHostNames) {
  std::string h;
  int p = 0;
  EXPECT_TRUE(parse_listen_addr(":9471", &h, &p));
  EXPECT_EQ(h, "");
  EXPECT_EQ(p, 9471);
  EXPECT_TRUE(parse_listen_addr("[::1]:9472", &h, &p));
  EXPECT_EQ(h, "::1");
  EXPECT_EQ(p, 9472);
  EXPECT_TRUE(parse_listen_addr("localhost:80", &h, &p));
  EXPECT_EQ(h, "localhost");
  EXPECT_TRUE(parse_listen_addr("127.0.0.1:0", &h, &p));
  EXPECT_EQ(h, "127.0.0.1");
  for (const char* bad : {"9471", "::1:9471", "[::1]", "[zz]:1", "a b:1", "h:70000", "h:", "h:-1", "h:1x"})
    EXPECT_FALSE(parse_listen_addr(bad, &h, &p)) << bad;
}
}  // namespace
}  // namespace shunt::telemetry
