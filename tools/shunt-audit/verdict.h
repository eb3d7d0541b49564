// The audit's judgement, free of hosts and devices: what each host reported
// (facts, JSON) and what the back-end measured go in, the tree of checks
// with pass/warn/fail comes out. Thresholds are relative to the fleet
// (its median) with absolute floors, so a fleet of slow soft-RoCE guests
// and one of 400G NICs are judged by the same rules.
#pragma once
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace audit {

enum class Status { pass = 0, warn = 1, fail = 2 };
const char* status_name(Status s);  // "pass", "warn", "fail"
inline Status worst(Status a, Status b) {
  return a > b ? a : b;
}
// The exit status of a verdict: 0 pass, 1 warnings only, 2 failures.
inline int exit_code(Status s) {
  return static_cast<int>(s);
}

struct Node {
  std::string name;
  Status status = Status::pass;
  std::string detail;
  std::string where;  // what the check is about: "h2/rxe1/1", "rail 0 h1->h3 via 192.168.1.2", ""
                      // for the fleet
  std::vector<Node> children;
  Node& add(Node n) { return children.emplace_back(std::move(n)); }
  // Sets every inner node's status to the worst of its children (and its own).
  Status roll_up();
};
nlohmann::json to_json(const Node& n);

struct Thresholds {
  // Bandwidth (higher is better): below warn_frac (fail_frac) of the fleet median,
  // or below the absolute floors (MB/s; 0: none).
  double bw_warn_frac = 0.5, bw_fail_frac = 0.3;
  double bw_warn_floor = 0, bw_fail_floor = 0;
  // Latency (lower is better): above warn_mult (fail_mult) x the median and
  // more than lat_slack_us above it (differences below that are noise).
  double lat_warn_mult = 3, lat_fail_mult = 10, lat_slack_us = 300;
  // Link error counters (symbol errors, link downed, ...): any rise fails.
  // Retransmit and sequence-error counters: a rise above retrans_warn and
  // above retrans_mult x the fleet's median rise warns.
  double retrans_warn = 200, retrans_mult = 5;
  // Memory lock limit below this (bytes) warns, unless unlimited or exempt (CAP_IPC_LOCK).
  double memlock_floor = 64.0 * 1024 * 1024;
  bool expect_nccl = false;  // NCCL missing on a host fails (default: noted only)
  // Probe loss on a path (a share of its probes): at or above warns (fails).
  double loss_warn = 0.01, loss_fail = 0.05;
  // A host's clock this far from the fleet's median offset (ms) warns
  // (fails); shunt's estimate of it less sure than clock_bound_warn_us warns.
  double clock_warn_ms = 100, clock_fail_ms = 60000, clock_bound_warn_us = 1000;
};

// Where v stands against the fleet's median m (higher is better).
Status judge_higher(double v, double median, double warn_frac, double fail_frac, double warn_floor,
                    double fail_floor);
// Lower is better (latency).
Status judge_lower(double v, double median, double warn_mult, double fail_mult, double slack);
double median(std::vector<double> v);  // 0 for none
// The value most hosts have (ties: the smallest), and which do not have it.
std::string majority(const std::vector<std::string>& values);

// One back-end measurement: src measured towards dst on a rail, through the
// router that path discovery named for its source port ("" unknown).
struct Measurement {
  int src = 0, dst = 0, rail = 0;
  std::string router;
  int sport = 0;
  double mbps = 0, lat_us = 0;
  std::string error;    // not empty: no connection or the transfer failed
  std::string skipped;  // not empty: not run, and why (a port already reported down)
};

// A leaf-spine link found degraded: every measurement of src on `rail`
// through `router` (its leaf's uplink to that router) is an outlier while
// the host's others are not.
struct LinkFault {
  int host = 0, rail = 0;
  std::string router;
  Status status = Status::warn;
  double mbps = 0, fleet_mbps = 0;
  double loss = -1;      // found by the probe mesh: the share of probes lost (-1: by bandwidth)
  bool inbound = false;  // lossy towards the host (from the others), not from it
};

// One path's value as a link is told from it: host (the end whose links
// are judged), rail, the router it went through ("" unknown), and the value
// judged (bandwidth, a share of probes lost); skip: counted in no group.
struct PathValue {
  int host = 0, rail = 0;
  std::string router;
  double value = 0;
  bool skip = false;
};
// A link found from a host's paths on a rail, grouped by router: where even
// the median of its best router is judged bad (and it has two paths or
// more), the host's own NIC or link to its leaf (router ""); otherwise each
// named router whose median is bad, the link from the host's leaf to it.
// value: that median; idx: the paths (indices into `paths`) it explains.
// In (host, rail) order, then by router.
struct LinkFinding {
  int host = 0, rail = 0;
  std::string router;
  Status status = Status::warn;
  double value = 0;
  std::vector<size_t> idx;
};
std::vector<LinkFinding> find_links(const std::vector<PathValue>& paths, bool higher_better,
                                    const std::function<Status(double value, int rail)>& judge);

struct Judged {
  std::vector<Status> bw, lat;    // per measurement, after attribution
  std::vector<std::string> note;  // per measurement: why it was excused, if it was
  std::vector<bool> explained;    // per measurement: a link in `links` explains it
  std::vector<LinkFault> links;
  std::map<int, double> bw_median;  // per rail: without the measurements `links` explain
};
// Judges every measurement against its rail's median (without those the
// degraded links found explain) and attributes groups of outliers to the
// link they share.
// names: the hosts' names for the notes ("host N" where not given).
Judged judge_backend(const std::vector<Measurement>& m, const Thresholds& t,
                     const std::vector<std::string>& names = {});

struct Mesh;  // mesh.h

// The whole tree: facts[i] is host i's report (facts.h's shape), names[i]
// its name; before/after its counters at the start and end of the audit;
// the probe mesh's results where it ran.
Node evaluate(const std::vector<nlohmann::json>& facts, const std::vector<std::string>& names,
              const std::vector<nlohmann::json>& counters_after, const std::vector<Measurement>& m,
              const Thresholds& t, const Mesh* mesh = nullptr);

}  // namespace audit
