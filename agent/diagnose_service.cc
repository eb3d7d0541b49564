#include "agent/diagnose_service.h"

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "agent/agent.h"
#include "clocksync/engine.h"
#include "core/event_log.h"
#include "core/log.h"
#include "core/mono.h"
#include "core/runtime.h"
#include "interpose/verbs/bundle.h"
#include "interpose/verbs/busy.h"
#include "interpose/verbs/registry.h"
#include "telemetry/diagnose.h"
#include "telemetry/rhythm.h"

namespace shunt::telemetry {

namespace {
using nlohmann::json;

// Never destroyed: the peer channel's thread may read the latest view
// while exit() runs the static destructors.
struct State {
  std::function<clocksync::ProbeEngine*()> engine;
  Diagnoser d;
  int64_t last_ms = -1;
  bool in_look = false;
  std::mutex mu;  // guards latest
  json latest;
  std::deque<double> step_past;  // this host's step time (ms) at the healthy looks, the last kStepPast
};
constexpr size_t kStepPast = 60;
State& st() {
  static auto* s = new State;
  return *s;
}

std::string host_name() {
  char h[256] = "unknown";
  gethostname(h, sizeof h - 1);
  return h;
}

// The probes' queues per route: each source path's port is a bundle path's,
// whose spine path discovery found (the members' bundles say which).
std::vector<RouteQueue> route_queues(clocksync::ProbeEngine* e, const json& members, const std::string& skip,
                                     const std::map<uint16_t, std::string>& own_ports, Diagnoser& d) {
  std::vector<RouteQueue> out;
  if (!e) return out;
  std::map<uint16_t, std::string> router = own_ports;  // source port -> spine
  for (const auto& [pid, m] : members.items()) {
    if (pid == skip || !m.is_object() || !m.contains("verbs") || !m["verbs"].is_object()) continue;
    const json& qps = m["verbs"].value("qps", json::array());
    if (!qps.is_array()) continue;
    for (const auto& q : qps)
      for (const auto& p : bundle_paths_of(q.is_object() ? q.value("bundle", json()) : json()))
        if (p.udp_sport >= 0 && !p.router.empty()) router[static_cast<uint16_t>(p.udp_sport)] = p.router;
  }
  d.set_host(host_name(), e->config().local_addrs);
  for (const auto& r : e->report()) {
    d.set_host(r.name, r.addrs);
    for (const auto& sp : r.source_paths) {
      auto it = router.find(sp.port);
      if (sp.reflected || it == router.end() || sp.rail < 0 || static_cast<size_t>(sp.rail) >= r.addrs.size()) continue;
      const auto& q = sp.stats.fwd_queue;
      // Queueing as evidence: congested, and by twice the detector's own
      // threshold (on a guest short of CPU, a route's delay wanders past
      // it now and then with no queue anywhere).
      out.push_back({r.addrs[sp.rail], it->second, q.excess_ns,
                     sp.stats.alive && q.congested && q.excess_ns >= 2 * q.threshold_ns});
    }
  }
  return out;
}

// The agent's own process, straight from its QP records: a full snapshot
// of itself every second (every QP and bundle as JSON) cost a one-CPU
// guest's job a tenth of its CPU. Bytes and busy time are read at every
// look; the share of each route (a bundle's paths and their spines) every
// kRouteEvery looks, from the bytes each route carried since the last time.
// Source port -> spine of the agent's own bundles' paths, as last read.
std::map<uint16_t, std::string>& own_ports() {
  static auto* m = new std::map<uint16_t, std::string>;  // agent thread only
  return *m;
}

std::vector<QpLook> own_looks() {
  constexpr int kRouteEvery = 5;
  struct Routes {
    std::map<std::string, uint64_t> last;    // cumulative bytes per spine at the last read
    std::map<std::string, double> share;     // of the bytes between the last two reads
  };
  static auto* routes = new std::map<const verbs::QpRecord*, Routes>;  // agent thread only
  static int n = 0;
  const bool read_routes = n++ % kRouteEvery == 0;
  if (read_routes) own_ports().clear();
  const std::string pid = std::to_string(getpid());
  std::vector<QpLook> out;
  verbs::for_each_qp([&](const verbs::QpRecord& r) {
    if (r.destroyed.load() || r.shadow_of || r.type != IBV_QPT_RC || !r.peer_addr[0]) {
      routes->erase(&r);
      return;
    }
    QpLook l;
    l.key = pid + "/" + r.device + "/" + std::to_string(r.qpn);
    l.local = r.local_addr;
    l.peer = r.peer_addr;
    l.bytes = verbs::total(r.s, [](const verbs::HotCounters& h) -> auto& { return h.send_bytes; });
    l.busy_ms = r.busy_ms.load(std::memory_order_relaxed);
    l.last_steps = r.last_steps.load(std::memory_order_relaxed);
    l.step_ends = verbs::step_ends();
    Routes& rt = (*routes)[&r];
    if (read_routes && r.bundle.load()) {
      std::map<std::string, uint64_t> now;
      const json b = verbs::bundle_json(r);
      for (const auto& p : bundle_paths_of(b)) {
        now[p.router] += p.bytes;
        if (p.udp_sport >= 0 && !p.router.empty()) own_ports()[static_cast<uint16_t>(p.udp_sport)] = p.router;
      }
      uint64_t moved = 0;
      for (const auto& [k, v] : now) moved += v - std::min(v, rt.last.count(k) ? rt.last[k] : 0);
      if (moved > 0) {
        rt.share.clear();
        for (const auto& [k, v] : now) {
          const uint64_t d = v - std::min(v, rt.last.count(k) ? rt.last[k] : 0);
          if (d) rt.share[k] = static_cast<double>(d) / moved;
        }
      }
      rt.last = std::move(now);
    }
    // Cumulative bytes per route as the looks expect them: this QP's bytes
    // split by the latest shares (all on "" while none is known).
    if (rt.share.empty()) l.routes.push_back({"", l.bytes});
    for (const auto& [k, f] : rt.share) l.routes.push_back({k, static_cast<uint64_t>(l.bytes * f)});
    out.push_back(std::move(l));
  });
  return out;
}

// The step rhythm of every running process that shows one: the others'
// from their reports, the agent's own process from its sampler.
json steps_of(const json& members, const std::string& own_pid) {
  json out = json::array();
  auto text = [](const json& m, const char* k) {
    auto it = m.find(k);
    return it != m.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  for (const auto& [pid, m] : members.items()) {
    if (!m.is_object()) continue;
    auto f = m.find("final");
    if (f != m.end() && f->is_boolean() && f->get<bool>()) continue;
    json step = pid == own_pid ? process_rhythm().view() : m.value("step", json());
    if (!step.is_object() || !step.value("period_ms", json()).is_number()) continue;
    step["pid"] = pid;
    step["rank"] = text(m, "rank");
    out.push_back(std::move(step));
  }
  if (!members.contains(own_pid))
    if (json step = process_rhythm().view(); step.is_object()) {
      step["pid"] = own_pid;
      step["rank"] = "";
      out.push_back(std::move(step));
    }
  return out;
}

void look() {
  State& s = st();
  const int64_t now = mono_ms();
  if (s.in_look || (s.last_ms >= 0 && now - s.last_ms < 900)) return;
  s.in_look = true;
  s.last_ms = now;
  try {
    // The other processes' reports as they came, the agent's own process
    // from its records.
    const json& members = agent::members_as_reported();
    const std::string own_pid = std::to_string(getpid());
    clocksync::ProbeEngine* e = s.engine ? s.engine() : nullptr;
    auto looks = qp_looks(members, own_pid);
    auto own = own_looks();
    looks.insert(looks.end(), own.begin(), own.end());
    auto queues = route_queues(e, members, own_pid, own_ports(), s.d);
    s.d.look(now, looks, queues);
    // This host's step time (the median over its ranks) against its own
    // recent baseline: evidence that a slowdown costs the job, not only a pair.
    json steps = steps_of(members, own_pid);
    std::vector<double> ms;
    for (const auto& st : steps) ms.push_back(st["period_ms"].get<double>());
    json step = nullptr;
    if (!ms.empty()) {
      std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
      step = {{"ms", ms[ms.size() / 2]}};
      if (!s.step_past.empty()) {
        std::vector<double> past(s.step_past.begin(), s.step_past.end());
        std::nth_element(past.begin(), past.begin() + past.size() / 2, past.end());
        step["baseline_ms"] = past[past.size() / 2];
      }
    }
    for (const auto& c : s.d.take_changes()) {
      const std::string kind = c.value("event", "");
      const std::string cause = c.value("cause", ""), name = c.value("name", "");
      if (kind == "slowdown") {
        std::string pairs;
        for (const auto& p : c["pairs"]) pairs += (pairs.empty() ? "" : ",") + p.value("local", "") + "->" + p.value("peer", "");
        event("slowdown", {{"cause", cause},
                           {"blamed", name},
                           {"confidence", c.value("confidence", "")},
                           {"evidence", c.value("evidence", "")},
                           {"worst_factor", c.value("worst_factor", 1.0)},
                           {"slow_pairs", c.value("slow_pairs", 0)},
                           // the host's step time now and its healthy baseline, ms (-1: no rhythm seen)
                           {"step_ms", step.is_object() ? step["ms"].get<double>() : -1.0},
                           {"step_baseline_ms", step.is_object() ? step.value("baseline_ms", -1.0) : -1.0},
                           {"pairs", pairs}});  // last: a long line loses its last fields
        log::info("diagnose: slowdown blamed on {} {} ({})", cause, name, c.value("evidence", ""));
      } else {
        event("slowdown_end", {{"cause", cause}, {"blamed", name}, {"lasted_ms", c.value("lasted_ms", int64_t{0})}});
        log::info("diagnose: slowdown on {} {} ended", cause, name);
      }
    }
    json v = s.d.view();
    v["host"] = host_name();
    v["steps"] = std::move(steps);
    v["step"] = step;
    if (step.is_object() && v.value("state", "") == "healthy") {
      s.step_past.push_back(step["ms"].get<double>());
      while (s.step_past.size() > kStepPast) s.step_past.pop_front();
    }
    std::lock_guard l(s.mu);
    s.latest = std::move(v);
  } catch (const std::exception& ex) {
    log::once(LogLevel::warn, "diagnose", std::string("diagnose: ") + ex.what());
  }
  s.in_look = false;
}
}  // namespace

json diagnosis_now() {
  State& s = st();
  std::lock_guard l(s.mu);
  return s.latest.is_null() ? json{{"host", host_name()}, {"state", "no data"}, {"pairs", json::array()}} : s.latest;
}

void register_diagnose(std::function<clocksync::ProbeEngine*()> engine) {
  st().engine = std::move(engine);
  agent::on_report([](const std::string&, const json&) { look(); });
  agent::register_command("diagnose", [](const json&) {
    json out = diagnosis_now();
    // Where the other hosts' agents listen (shuntctl diagnose asks them over the peer channel)
    json peers = json::array();
    clocksync::ProbeEngine* e = st().engine ? st().engine() : nullptr;
    if (e)
      for (const auto& r : e->report()) peers.push_back({{"name", r.name}, {"addrs", r.addrs}});
    out["peers"] = peers;
    out["peer_port"] = config().num(Param::peer_port);
    return out;
  });
}

}  // namespace shunt::telemetry
