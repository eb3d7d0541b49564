// Workload diagnosis: why the job is slow, and what to blame. Pure: fed the
// counters the host agent already has, one look about every second, it
// keeps per peer pair (this host's address -> the peer's) the rate the pair
// reaches while it has work out (bytes over busy time, interpose/verbs/busy.h)
// against the pair's own recent baseline, and blames a slowdown on the one
// thing the slow pairs share and the healthy ones do not:
// - a link between a host's rail and a spine: every pair whose route
//   crosses it (its source port's spine, from path discovery) is slow,
//   and, as evidence, the probes on that route queue;
// - a host: every pair of that host is slow, whatever its route, and its
//   probes do not queue (CPU, PCIe, the NIC itself);
// - one path: a single pair, nothing shared.
// A job that merely waits (its step ends later) is not slow: the busy rate
// of a pair that waits does not change.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shunt::telemetry {

// One QP's cumulative counters at a look.
struct QpLook {
  std::string key;    // unique while the QP lives (pid/device/qpn)
  std::string local;  // this end's address
  std::string peer;   // the other end's address
  uint64_t bytes = 0, busy_ms = 0;
  // Cumulative bytes per route: the spine ("router") that path discovery
  // saw each path's source port take; "" where unknown.
  std::vector<std::pair<std::string, uint64_t>> routes;
  // Ends of its process's steps (verbs::step_ends), and those at which this
  // QP was among the last with work: the pair's share of a step's critical path.
  uint64_t step_ends = 0, last_steps = 0;
};

// What the probes say of one route towards a peer address.
struct RouteQueue {
  std::string peer;    // the peer's address
  std::string router;  // the spine
  double excess_ns = 0;
  bool congested = false;  // queueing clearly (see diagnose_service.cc)
};

struct DiagnoseOptions {
  double slow = 0.5;         // a pair is slow below this share of its baseline rate
  double healthy = 0.75;     // and healthy again above this one
  int window = 4;            // looks a rate is taken over
  int warmup = 10;           // looks with data before a pair has a baseline
  int confirm = 1;           // consecutive looks that change a pair's state
  int settle = 3;            // consecutive looks that name a new cause before it is reported
  int host_confirm = 6;      // looks every pair of this host stays low before the host is slow
  int64_t min_busy_ms = 120; // busy time in a window for a rate to count
};

class Diagnoser {
 public:
  static constexpr size_t kHistory = 60;
  static constexpr size_t kPast = 60;
  explicit Diagnoser(DiagnoseOptions o = {}) : o_(o) {}
  // Addresses of one host (a peer's rails), so a host is blamed as one.
  void set_host(const std::string& name, const std::vector<std::string>& addrs);
  void look(int64_t now_ms, const std::vector<QpLook>& qps, const std::vector<RouteQueue>& queues);
  // {"state": "healthy"|"slow"|"warming up", "slowdown": {...}|null, "pairs": [...]}
  nlohmann::json view() const;
  // Slowdowns that began or ended since the last call, oldest first:
  // {"event": "slowdown"|"slowdown_end", ...}.
  std::vector<nlohmann::json> take_changes();

 private:
  struct Tick {
    uint64_t bytes = 0, busy_ms = 0;
    std::map<std::string, uint64_t> routes;
    uint64_t step_ends = 0, last_steps = 0;  // the pair's process's step ends, and those it ended
  };
  struct Pair {
    std::string local, peer;
    std::deque<Tick> ticks;
    std::deque<std::pair<uint64_t, uint64_t>> history;  // (bytes, busy ms) of the last kHistory looks
    double base = 0;  // bytes per busy ms: the median of `past`
    int based = 0;    // windows that went into base
    std::deque<double> past;  // window rates while healthy, the last kPast
    std::deque<double> rel_past;  // the same over the host's median pair rate at each look
    double rel_base = 1;
    double rate = -1; // now; -1 without data
    int below = 0, above = 0;
    int raw_below = 0;  // consecutive looks below the mark against its own baseline alone
    bool slow = false;
    int64_t last_data_ms = 0;
    std::deque<std::pair<uint64_t, uint64_t>> last;  // (steps ended last, steps) of the last kLastLooks looks
  };
  struct Prev {
    uint64_t bytes = 0, busy_ms = 0;
    std::map<std::string, uint64_t> routes;
    int64_t seen_ms = 0;
    uint64_t step_ends = 0, last_steps = 0;
  };
  static constexpr size_t kLastLooks = 15;
  // The share of the steps of the last kLastLooks looks that the pair ended
  // last (on the step's critical path), or -1 without steps.
  static double last_share(const Pair& p);
  void blame(int64_t now_ms, const std::vector<RouteQueue>& queues);
  static std::vector<std::string> window_routes(const Pair& p);
  std::string host_of(const std::string& addr) const;

  DiagnoseOptions o_;
  std::map<std::string, Prev> prev_;                          // by QP key
  std::map<std::pair<std::string, std::string>, Pair> pairs_;  // (local, peer)
  std::map<std::string, std::string> hosts_;                   // address -> host name
  nlohmann::json current_;                                     // the slowdown in force, or null
  std::string pending_;                                        // a new cause, not yet settled
  int pending_n_ = 0;
  bool host_wide_ = false;  // every pair of this host low for long, no route queueing
  std::vector<nlohmann::json> changes_;
  std::vector<RouteQueue> queues_;  // the last look's
  int64_t now_ms_ = 0;
};

// One path of a bundle as its JSON (bundle_json) gives it: the primary
// first, then the shadows.
struct BundlePath {
  std::string router;  // "" where path discovery found none
  uint64_t bytes = 0;
  int udp_sport = -1;  // -1 where unknown
};
std::vector<BundlePath> bundle_paths_of(const nlohmann::json& bundle);

// The QPs of the host agent's members (pid -> stats_json report) as looks,
// but those of process `skip` ("" for none).
std::vector<QpLook> qp_looks(const nlohmann::json& members, const std::string& skip = "");

}  // namespace shunt::telemetry
