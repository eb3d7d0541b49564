#include "telemetry/metrics.h"

#include <map>
#include <tuple>
#include <vector>

#include "clocksync/engine.h"
#include "core/runtime.h"
#include "telemetry/prom.h"
#include "telemetry/report_json.h"
#include "telemetry/rhythm.h"

namespace shunt::telemetry {

namespace {
using nlohmann::json;
using namespace reports;

double ns_to_s(double ns) { return ns / 1e9; }

// A process's series carry its job and rank, never its pid: processes come
// and go, the job's ranks on a host are as many as its GPUs. "job" is the
// scrape job's label in Prometheus, so the job's own id is "shunt_job".
Labels proc_labels(const json& m) {
  Labels l;
  if (auto j = str(m, "job"); !j.empty()) l.emplace_back("shunt_job", j);
  if (auto r = str(m, "rank"); !r.empty()) l.emplace_back("rank", r);
  return l;
}

Labels with(Labels l, std::initializer_list<std::pair<std::string, std::string>> more) {
  for (auto& p : more) l.push_back(p);
  return l;
}

void declare(Exposition& x) {
  x.family("shunt_build_info", "gauge", "Always 1; the shunt version of the host agent in the version label.");
  x.family("shunt_agent_uptime_seconds", "gauge", "Seconds since this process became the host agent.");
  x.family("shunt_pair_busy_rate_bytes_per_second", "gauge",
           "Send rate of a peer pair (this host's address to the peer's) while it has work out, over the last seconds.");
  x.family("shunt_pair_baseline_rate_bytes_per_second", "gauge", "The same pair's own recent baseline rate.");
  x.family("shunt_pair_transfer_seconds", "histogram",
           "How long each stretch of work out on a QP lasted (one step's exchange with that peer), to about 20 ms.");
  x.family("shunt_pair_slow", "gauge", "1 while the pair runs below half its baseline rate (shuntctl diagnose).");
  x.family("shunt_slowdown", "gauge",
           "1 while this host sees a slowdown, by the kind of cause blamed (link, host, path); shuntctl diagnose names it.");
  x.family("shunt_slowdown_worst_ratio", "gauge", "The slowest blamed pair's rate over its baseline (1 when healthy).");
  x.family("shunt_step_seconds", "gauge",
           "A rank's step time, from the rhythm of its QPs' work (shuntctl diagnose); absent while it shows none.");
  x.family("shunt_step_confidence_ratio", "gauge", "How well the rank's traffic repeats at that step time (0..1).");
  x.family("shunt_step_communication_ratio", "gauge", "Share of the rank's recent time with work out on its QPs.");
  x.family("shunt_processes", "gauge", "Shunt processes known to the host agent, by state (running, exited).");
  x.family("shunt_process_mode", "gauge",
           "1 for each process known to the host agent, by its mode (off: shunt turned itself off there, e.g. over a bad setting; shuntctl status says why).");
  x.family("shunt_verbs_calls_total", "counter", "Calls of each interposed verbs entry point.");
  x.family("shunt_qps", "gauge", "Queue pairs seen, by state (live, destroyed).");
  x.family("shunt_qp_tx_bytes_total", "counter", "Bytes posted in send WRs of a rank's QPs on a device (sum of SGE lengths).");
  x.family("shunt_qp_rx_bytes_total", "counter",
           "Bytes received on a rank's QPs on a device (byte_len of successful receive completions).");
  x.family("shunt_qp_tx_wrs_total", "counter", "Send WRs posted on a rank's QPs on a device, by opcode.");
  x.family("shunt_qp_rx_wrs_total", "counter", "Receive WRs posted on a rank's QPs on a device.");
  x.family("shunt_qp_completions_total", "counter", "Completions polled for a rank's QPs on a device.");
  x.family("shunt_qp_errors_total", "counter", "Completions with an error of a rank's QPs on a device, by status.");
  x.family("shunt_qp_post_errors_total", "counter",
           "Failed ibv_post_send/ibv_post_recv calls on a rank's QPs on a device, by direction.");
  x.family("shunt_sockets", "gauge", "TCP sockets seen, by state (open, closed) and role (client, listener, accepted).");
  x.family("shunt_socket_tx_bytes_total", "counter", "Bytes sent on TCP sockets, by role and the two ends' addresses (no ports).");
  x.family("shunt_socket_rx_bytes_total", "counter", "Bytes received on TCP sockets, by role and the two ends' addresses (no ports).");
  x.family("shunt_socket_accepts_total", "counter", "Connections accepted on listening sockets, by local address.");
  x.family("shunt_socket_subflows", "gauge", "MPTCP subflows of a rank's open sockets (0 for plain TCP).");
  x.family("shunt_bundles", "gauge", "Multipath bundles of a process, by state (up, degraded, fallback).");
  x.family("shunt_bundle_paths", "gauge",
           "Paths of a rank's bundles on a device (path: primary for the application's QP, else the shadow's index; nic: the NIC it runs on).");
  x.family("shunt_bundle_path_up", "gauge", "How many of those paths are in service.");
  x.family("shunt_bundle_path_carrier", "gauge", "How many of those paths carry their bundle's two-sided work (SENDs, receives).");
  x.family("shunt_bundle_path_tx_bytes_total", "counter", "Bytes of the application's WRs posted on those paths.");
  x.family("shunt_bundle_path_failures_total", "counter",
           "Times one of those paths was taken out of service (error completion, stall, port event or the peer's word).");
  x.family("shunt_bundle_path_share", "gauge",
           "The largest weight of those shadows in their bundles' split WRITEs (mean 1 over a bundle's shadows; steering moves it off congested paths).");
  x.family("shunt_bundle_path_queue_seconds", "gauge",
           "The longest forward queue of those shadows: the probes' one-way delay on a shadow's source port over the path's base delay.");
  x.family("shunt_bundle_path_congested", "gauge",
           "How many of those shadows have a forward queue over the threshold measured from its own delay noise.");
  x.family("shunt_failovers_total", "counter", "Two-sided work of a bundle moved off a failed path (failover events).");
  x.family("shunt_failbacks_total", "counter", "Traffic moved back to a recovered path.");
  x.family("shunt_replays_total", "counter", "Work requests replayed on another path after a failure.");
  x.family("shunt_events_total", "counter", "Events recorded (logged or not), by type.");
  x.family("shunt_events_dropped_total", "counter", "Events lost because the event ring was full.");
  x.family("shunt_path_up", "gauge", "1 when the probe engine sees the path working both ways, else 0.");
  x.family("shunt_path_one_way_delay_seconds", "histogram",
           "One-way delay of a path's probes, by direction (tx: to the peer, rx: from it), since the clock model exists.");
  x.family("shunt_path_rtt_seconds", "gauge", "Round-trip time of a path: median forward plus median reverse delay.");
  x.family("shunt_path_loss_ratio", "gauge", "Fraction of probes lost on a path in the window, by direction.");
  x.family("shunt_path_probes_sent_total", "counter", "Probes sent on a path.");
  x.family("shunt_path_probes_received_total", "counter", "Probes received on a path.");
  x.family("shunt_path_tx_bytes_total", "counter", "TCP bytes member processes sent over a path (by its two addresses).");
  x.family("shunt_path_rx_bytes_total", "counter", "TCP bytes member processes received over a path.");
  x.family("shunt_peer_clock_valid", "gauge", "1 when the clock model of a peer is usable.");
  x.family("shunt_peer_clock_offset_seconds", "gauge", "The peer's clock minus this host's.");
  x.family("shunt_peer_clock_bound_seconds", "gauge", "Bound on the error of the clock offset.");
  x.family("shunt_peer_clock_drift_ratio", "gauge", "Rate of the peer's clock relative to ours, minus 1.");
  x.family("shunt_peer_rtt_seconds", "gauge", "Round-trip time to a peer from the clock model (twice the half RTT).");
}

void qp_samples(Exposition& x, const Labels& base, const json& q) {
  x.add("shunt_qp_tx_bytes_total", base, u64(q, "send_bytes"));
  x.add("shunt_qp_rx_bytes_total", base, u64(q, "recv_bytes"));
  x.add("shunt_qp_rx_wrs_total", base, u64(q, "recv_wrs"));
  x.add("shunt_qp_completions_total", base, u64(q, "completions"));
  x.add("shunt_qp_post_errors_total", with(base, {{"direction", "send"}}), u64(q, "send_post_errors"));
  x.add("shunt_qp_post_errors_total", with(base, {{"direction", "recv"}}), u64(q, "recv_post_errors"));
  for (auto& [op, n] : dict(q, "send_wrs").items())
    x.add("shunt_qp_tx_wrs_total", with(base, {{"opcode", op}}), count(n));
  for (auto& [st, n] : dict(q, "errors").items())
    x.add("shunt_qp_errors_total", with(base, {{"status", st}}), count(n));
}

using SocketCounts = std::map<std::pair<std::string, std::string>, uint64_t>;  // (state, role) -> n
// (local, peer) -> transfer counts per kTransferBucketsMs bound and over all, and their sum in ms
using Transfers = std::map<std::pair<std::string, std::string>, std::pair<std::vector<uint64_t>, uint64_t>>;

void add_transfers(Transfers* t, const json& e) {
  const json& counts = at(e, "transfers");
  const std::string local = str(e, "local"), peer = str(e, "peer");
  if (local.empty() || peer.empty() || !counts.is_array() || counts.size() != kTransferBucketsMs.size() + 1) return;
  auto& [c, sum] = (*t)[{local, peer}];
  c.resize(counts.size());
  for (size_t i = 0; i < counts.size(); i++) c[i] += count(counts[i]);
  sum += u64(e, "transfer_ms");
}

void member_samples(Exposition& x, const json& m, SocketCounts* sockets, Transfers* transfers) {
  Labels p = proc_labels(m);
  const bool retired = flag(m, "retired");  // fold_exited(): counters alone
  if (!retired) x.add("shunt_process_mode", with(p, {{"mode", str(m, "mode")}}), 1);
  if (at(m, "verbs").is_object()) {
    const json& v = at(m, "verbs");
    for (auto& [call, n] : dict(v, "calls").items())
      x.add("shunt_verbs_calls_total", with(p, {{"call", call}}), count(n));
    uint64_t live = 0, dead = 0;
    for (auto& q : list(v, "qps")) {
      (flag(q, "destroyed") ? dead : live)++;
      add_transfers(transfers, q);
      qp_samples(x, with(p, {{"device", str(q, "device")}, {"type", str(q, "type")}}), q);
    }
    for (auto& d : list(v, "devices")) {
      const json& u = at(d, "untracked_qps");
      if (u64(u, "send_bytes") || u64(u, "recv_wrs") || u64(u, "completions"))
        qp_samples(x, with(p, {{"device", str(d, "device")}, {"type", "untracked"}}), u);
    }
    if (!retired) {
      x.add("shunt_qps", with(p, {{"state", "live"}}), live);
      x.add("shunt_qps", with(p, {{"state", "destroyed"}}), dead);
    }
  }
  // Sockets summed per role and the two ends' addresses: ports (ephemeral
  // ones) would make a series per connection.
  std::map<std::tuple<std::string, std::string, std::string>, std::pair<uint64_t, uint64_t>> conns;
  std::map<std::string, uint64_t> accepts;
  uint64_t subflows = 0;
  // closed_sockets: older closed ones summed ("sockets" of them), so the
  // totals stay whole while the report stays as small as the open sockets.
  for (const char* key : {"sockets", "closed_sockets"}) {
    const bool summed = key[0] == 'c';
    for (auto& s : list(m, key)) {
      std::string role = str(s, "role"), local = host_of(str(s, "local")), remote = host_of(str(s, "peer"));
      bool open = !summed && flag(s, "open");
      (*sockets)[{open ? "open" : "closed", role}] += summed ? u64(s, "sockets") : 1;
      if (open) subflows += list(at(s, "mptcp"), "subflow").size();
      if (role == "listener") {
        accepts[local] += u64(s, "accepts");
        continue;
      }
      auto& c = conns[{role, local, remote}];
      c.first += u64(s, "tx_bytes");
      c.second += u64(s, "rx_bytes");
    }
  }
  for (auto& [k, v] : conns) {
    auto& [role, local, remote] = k;
    Labels l = with(p, {{"role", role}, {"local", local}, {"remote", remote}});
    x.add("shunt_socket_tx_bytes_total", l, v.first);
    x.add("shunt_socket_rx_bytes_total", l, v.second);
  }
  for (auto& [local, n] : accepts) x.add("shunt_socket_accepts_total", with(p, {{"local", local}}), n);
  // An exited process's last gauges are no state of now; its counters stay
  // in the sums (they never go backwards).
  const bool running = !flag(m, "final");
  if (running) x.add("shunt_socket_subflows", p, subflows);
  // The step rhythm (telemetry/rhythm.h) of a rank's processes: the one
  // that communicates (a rank's helpers have none).
  if (const json& step = at(m, "step"); running && step.is_object() && real(step, "period_ms", 0) > 0) {
    x.add_max("shunt_step_seconds", p, real(step, "period_ms", 0) / 1e3);
    x.add_max("shunt_step_confidence_ratio", p, real(step, "confidence", 0));
    x.add_max("shunt_step_communication_ratio", p, real(step, "comm_share", 0));
  }
  std::map<std::string, uint64_t> bundles{{"up", 0}, {"degraded", 0}, {"fallback", 0}};
  // Bundle paths summed per device, NIC and path index over the rank's QPs
  // (source ports and QP numbers change with every renewal and connection);
  // a path's counters, of a live bundle or of destroyed ones summed.
  auto path_counters = [&](const std::string& device, const json& q) {
    Labels l = with(p, {{"device", device}, {"nic", str(q, "nic")}, {"path", str(q, "path")}});
    x.add("shunt_bundle_path_tx_bytes_total", l, u64(q, "tx_bytes"));
    x.add("shunt_bundle_path_failures_total", l, u64(q, "fails"));
    return l;
  };
  for (auto& b : list(m, "bundles")) {
    bundles[str(b, "state")]++;
    for (auto& q : list(b, "paths")) {
      Labels l = path_counters(str(b, "device"), q);
      if (!running) continue;
      x.add("shunt_bundle_paths", l, 1);
      x.add("shunt_bundle_path_up", l, flag(q, "up") ? 1 : 0);
      x.add("shunt_bundle_path_carrier", l, flag(q, "carrier") ? 1 : 0);
      if (at(q, "share").is_number()) x.add_max("shunt_bundle_path_share", l, real(q, "share", 1.0));
      if (at(q, "queue").is_object()) {
        x.add_max("shunt_bundle_path_queue_seconds", l, real(at(q, "queue"), "excess_ns", 0.0) / 1e9);
        x.add("shunt_bundle_path_congested", l, flag(at(q, "queue"), "congested") ? 1 : 0);
      }
    }
  }
  for (auto& e : list(m, "transfers")) add_transfers(transfers, e);  // fold_exited's
  // Destroyed QPs' bundles, summed by the process: counters only.
  for (auto& q : list(m, "closed_bundle_paths")) path_counters(str(q, "device"), q);
  if (running)
    for (auto& [state, n] : bundles) x.add("shunt_bundles", with(p, {{"state", state}}), n);
  const json& ev = dict(m, "events");
  x.add("shunt_failovers_total", p, u64(ev, "failover"));
  x.add("shunt_failbacks_total", p, u64(ev, "failback"));
  x.add("shunt_replays_total", p, u64(m, "replays"));
  for (auto& [type, n] : ev.items())
    if (n.is_number()) x.add("shunt_events_total", with(p, {{"type", type}}), count(n));
  x.add("shunt_events_dropped_total", p, u64(m, "events_dropped"));
}
// {le: [counts per kDelayBucketsNs bound, cumulative], count, sum_ns}
void delay_histogram(Exposition& x, const Labels& l, const json& h) {
  const json& le = list(h, "le");
  if (le.size() != clocksync::kDelayBucketsNs.size()) return;  // (none yet, or another build's bounds)
  const char* name = "shunt_path_one_way_delay_seconds";
  for (size_t i = 0; i < le.size(); i++)
    x.add_part(name, "_bucket", with(l, {{"le", format_value(clocksync::kDelayBucketsNs[i] / 1e9)}}), count(le[i]));
  x.add_part(name, "_bucket", with(l, {{"le", "+Inf"}}), u64(h, "count"));
  x.add_part(name, "_sum", l, ns_to_s(real(h, "sum_ns", 0.0)));
  x.add_part(name, "_count", l, u64(h, "count"));
}
}  // namespace

HostView host_view_from(const json& a) {
  HostView v;
  if (a.contains("members") && a["members"].is_object()) v.members = a["members"];
  if (a.contains("peers") && a["peers"].is_array()) v.peers = a["peers"];
  v.agent_pid = at(a, "agent_pid").is_number_integer() ? at(a, "agent_pid").get<long>() : 0;
  v.uptime_s = real(a, "uptime_s", 0.0);
  if (a.contains("diagnosis") && a["diagnosis"].is_object()) v.diagnosis = a["diagnosis"];
  v.exited_dropped = u64(a, "exited_dropped");
  if (a.contains("retired") && a["retired"].is_array()) v.retired = a["retired"];
  return v;
}

json host_view_json(const HostView& v) {
  return {{"members", v.members},
          {"peers", v.peers},
          {"agent_pid", v.agent_pid},
          {"uptime_s", v.uptime_s},
          {"diagnosis", v.diagnosis},
          {"exited_dropped", v.exited_dropped},
          {"retired", v.retired}};
}

namespace {
json hist_json(const clocksync::DelayHistogram& h) {
  return {{"le", h.le}, {"count", h.count}, {"sum_ns", h.sum_ns}};
}
}  // namespace

json peers_view(const clocksync::ProbeEngine* e) {
  json out = json::array();
  if (!e) return out;
  std::vector<clocksync::PeerSpec> specs;
  std::string err;
  clocksync::parse_peers(config().str(Param::peers), &specs, &err);
  const auto& local = e->config().local_addrs;
  for (const auto& r : e->report()) {
    const std::vector<std::string>* remote = nullptr;
    for (auto& s : specs)
      if (s.name == r.name) remote = &s.addrs;
    json paths = json::array();
    for (size_t i = 0; i < r.paths.size(); i++) {
      const auto& p = r.paths[i];
      paths.push_back({{"rail", i},
                       {"local", i < local.size() ? local[i] : ""},
                       {"remote", remote && i < remote->size() ? (*remote)[i] : ""},
                       {"alive", p.alive},
                       {"fwd_p50_ns", p.fwd_p50_ns},
                       {"fwd_p99_ns", p.fwd_p99_ns},
                       {"rev_p50_ns", p.rev_p50_ns},
                       {"rev_p99_ns", p.rev_p99_ns},
                       {"fwd_hist", hist_json(p.fwd_hist)},
                       {"rev_hist", hist_json(p.rev_hist)},
                       {"fwd_loss", p.fwd_loss},
                       {"rev_loss", p.rev_loss},
                       {"sent", p.sent},
                       {"received", p.received}});
    }
    out.push_back({{"peer", r.name},
                   {"clock",
                    {{"valid", r.clock.valid},
                     {"offset_ns", r.clock.offset_ns},
                     {"bound_ns", r.clock.bound_ns},
                     {"drift_ppb", r.clock.drift_ppb},
                     {"half_rtt_ns", r.clock.half_rtt_ns},
                     {"age_ns", r.clock.age_ns}}},
                   {"paths", paths}});
  }
  return out;
}

json bundle_paths_view(const HostView& v) {
  json out = json::array();
  if (!v.members.is_object()) return out;
  for (auto& [pid, m] : v.members.items()) {
    if (flag(m, "final")) continue;
    for (auto& b : list(m, "bundles")) {
      for (auto& q : list(b, "paths"))
        out.push_back({{"pid", pid},
                       {"rank", str(m, "rank")},
                       {"device", str(b, "device")},
                       {"qpn", u64(b, "qpn")},
                       {"path", str(q, "path")},
                       {"udp_sport", u64(q, "udp_sport")},
                       {"up", flag(q, "up")},
                       {"carrier", flag(q, "carrier")},
                       {"tx_bytes", u64(q, "tx_bytes")},
                       {"fails", u64(q, "fails")},
                       {"share", at(q, "share")},
                       {"queue", at(q, "queue")}});
    }
  }
  return out;
}

json paths_view(const HostView& v) {
  json out = json::array();
  for (auto& peer : v.peers)
    for (auto& p : list(peer, "paths")) {
      if (!p.is_object()) continue;
      json q = p;
      q["peer"] = at(peer, "peer");
      std::string local = str(p, "local"), remote = str(p, "remote");
      q["path"] = local + "->" + remote;
      uint64_t tx = 0, rx = 0;
      auto credit = [&](const json& e, const std::string& l, const std::string& r) {
        if (!local.empty() && l == local && r == remote) tx += u64(e, "tx_bytes"), rx += u64(e, "rx_bytes");
      };
      // An MPTCP connection's bytes go to the paths its subflows used (an
      // MPTCP connection's own addresses are its first subflow's, whichever
      // rail carries it now); a plain socket's to its two addresses.
      auto member = [&](const json& m) {
        for (const char* key : {"sockets", "closed_sockets"})
          for (auto& s : list(m, key)) {
            if (at(s, "paths").is_array()) {
              for (auto& e : list(s, "paths")) credit(e, str(e, "local"), str(e, "remote"));
            } else {
              credit(s, host_of(str(s, "local")), host_of(str(s, "peer")));
            }
          }
      };
      for (auto& [pid, m] : v.members.items()) member(m);
      for (auto& m : v.retired) member(m);
      q["tx_bytes"] = tx;
      q["rx_bytes"] = rx;
      double f = real(p, "fwd_p50_ns", -1.0), r = real(p, "rev_p50_ns", -1.0);
      q["rtt_ns"] = f >= 0 && r >= 0 ? f + r : -1.0;
      out.push_back(std::move(q));
    }
  return out;
}

namespace {
void diagnosis_samples(Exposition& x, const json& d) {
  if (!d.is_object()) return;
  const json& pairs = at(d, "pairs");
  if (pairs.is_array())
    for (const auto& p : pairs) {
      Labels l{{"local", str(p, "local")}, {"peer", str(p, "peer")}};
      if (const json& r = at(p, "rate_Bps"); r.is_number()) x.add("shunt_pair_busy_rate_bytes_per_second", l, r.get<double>());
      if (const json& b = at(p, "baseline_Bps"); b.is_number())
        x.add("shunt_pair_baseline_rate_bytes_per_second", l, b.get<double>());
      x.add("shunt_pair_slow", l, flag(p, "slow"));
    }
  const json& s = at(d, "slowdown");
  const std::string cause = s.is_object() ? str(s, "cause") : "";
  for (const char* c : {"link", "host", "path"}) x.add("shunt_slowdown", {{"cause", c}}, cause == c);
  x.add("shunt_slowdown_worst_ratio", {}, s.is_object() ? real(s, "worst_factor", 1.0) : 1.0);
}
}  // namespace

std::string render_metrics(const HostView& v) {
  Exposition x;
  declare(x);
  x.add("shunt_build_info", {{"version", SHUNT_VERSION}}, 1);
  x.add("shunt_agent_uptime_seconds", {}, v.uptime_s);
  uint64_t running = 0, exited = 0;
  SocketCounts sockets;
  Transfers transfers;
  for (auto& [pid, m] : v.members.items()) {
    (void)pid;
    (flag(m, "final") ? exited : running)++;
    member_samples(x, m, &sockets, &transfers);
  }
  for (auto& m : v.retired) member_samples(x, m, &sockets, &transfers);
  for (auto& [ends, t] : transfers) {
    const char* name = "shunt_pair_transfer_seconds";
    Labels l{{"local", ends.first}, {"peer", ends.second}};
    uint64_t n = 0;
    for (size_t i = 0; i < kTransferBucketsMs.size(); i++)
      x.add_part(name, "_bucket", with(l, {{"le", format_value(kTransferBucketsMs[i] / 1e3)}}), n += t.first[i]);
    n += t.first.back();
    x.add_part(name, "_bucket", with(l, {{"le", "+Inf"}}), n);
    x.add_part(name, "_sum", l, t.second / 1e3);
    x.add_part(name, "_count", l, n);
  }
  x.add("shunt_processes", {{"state", "running"}}, running);
  x.add("shunt_processes", {{"state", "exited"}}, exited + v.exited_dropped);
  for (const char* state : {"open", "closed"})
    for (const char* role : {"client", "listener", "accepted"}) {
      auto it = sockets.find({state, role});
      x.add("shunt_sockets", {{"state", state}, {"role", role}}, it == sockets.end() ? uint64_t{0} : it->second);
    }
  for (auto& peer : v.peers) {
    const json& c = at(peer, "clock");
    Labels pl{{"peer", str(peer, "peer")}};
    bool valid = flag(c, "valid");
    x.add("shunt_peer_clock_valid", pl, valid);
    if (!valid) continue;
    x.add("shunt_peer_clock_offset_seconds", pl, ns_to_s(real(c, "offset_ns", 0.0)));
    x.add("shunt_peer_clock_bound_seconds", pl, ns_to_s(real(c, "bound_ns", 0.0)));
    x.add("shunt_peer_clock_drift_ratio", pl, real(c, "drift_ppb", 0.0) / 1e9);
    x.add("shunt_peer_rtt_seconds", pl, ns_to_s(2 * real(c, "half_rtt_ns", 0.0)));
  }
  diagnosis_samples(x, v.diagnosis);
  for (auto& p : paths_view(v)) {
    Labels l{{"peer", str(p, "peer")}, {"rail", std::to_string(u64(p, "rail"))}, {"path", str(p, "path")}};
    x.add("shunt_path_up", l, flag(p, "alive"));
    for (auto [key, dir] : {std::pair{"fwd_hist", "tx"}, std::pair{"rev_hist", "rx"}})
      delay_histogram(x, with(l, {{"direction", dir}}), at(p, key));
    if (double rtt = real(p, "rtt_ns", -1.0); rtt >= 0) x.add("shunt_path_rtt_seconds", l, ns_to_s(rtt));
    x.add("shunt_path_loss_ratio", with(l, {{"direction", "tx"}}), real(p, "fwd_loss", 0.0));
    x.add("shunt_path_loss_ratio", with(l, {{"direction", "rx"}}), real(p, "rev_loss", 0.0));
    x.add("shunt_path_probes_sent_total", l, u64(p, "sent"));
    x.add("shunt_path_probes_received_total", l, u64(p, "received"));
    x.add("shunt_path_tx_bytes_total", l, u64(p, "tx_bytes"));
    x.add("shunt_path_rx_bytes_total", l, u64(p, "rx_bytes"));
  }
  return x.text();
}

}  // namespace shunt::telemetry
