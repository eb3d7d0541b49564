#include "telemetry/diagnose.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace shunt::telemetry {

using nlohmann::json;

void Diagnoser::set_host(const std::string& name, const std::vector<std::string>& addrs) {
  for (const auto& a : addrs)
    if (!a.empty()) hosts_[a] = name;
}

std::string Diagnoser::host_of(const std::string& addr) const {
  auto it = hosts_.find(addr);
  return it == hosts_.end() ? addr : it->second;
}

namespace {
// The spines a window went through (those that carried a twentieth of its
// bytes or more).
template <typename Ticks>
std::vector<std::string> routes_of(const Ticks& ticks) {
  std::map<std::string, uint64_t> sum;
  uint64_t all = 0;
  for (const auto& t : ticks)
    for (const auto& [r, b] : t.routes) {
      sum[r] += b;
      all += b;
    }
  std::vector<std::string> out;
  for (const auto& [r, b] : sum)
    if (!r.empty() && b * 20 >= all && b > 0) out.push_back(r);
  return out;
}
}  // namespace

std::vector<std::string> Diagnoser::window_routes(const Pair& p) { return routes_of(p.ticks); }

double Diagnoser::last_share(const Pair& p) {
  uint64_t last = 0, steps = 0;
  for (const auto& [l, s] : p.last) last += l, steps += s;
  return steps ? static_cast<double>(last) / static_cast<double>(steps) : -1;
}

void Diagnoser::look(int64_t now_ms, const std::vector<QpLook>& qps, const std::vector<RouteQueue>& queues) {
  now_ms_ = now_ms;
  std::map<std::pair<std::string, std::string>, Tick> ticks;
  std::set<std::string> live;
  for (const auto& q : qps) {
    if (q.peer.empty() || q.local.empty()) continue;
    live.insert(q.key);
    std::map<std::string, uint64_t> routes;
    for (const auto& [r, b] : q.routes) routes[r] += b;
    Tick& t = ticks[{q.local, q.peer}];
    auto it = prev_.find(q.key);
    if (it != prev_.end() && q.bytes >= it->second.bytes && q.busy_ms >= it->second.busy_ms) {
      t.bytes += q.bytes - it->second.bytes;
      t.busy_ms += q.busy_ms - it->second.busy_ms;
      for (const auto& [r, b] : routes) {
        uint64_t was = it->second.routes.count(r) ? it->second.routes[r] : 0;
        if (b > was) t.routes[r] += b - was;
      }
      // A pair's QPs share their process's step ends: counted once.
      if (q.step_ends >= it->second.step_ends && q.last_steps >= it->second.last_steps) {
        t.step_ends = std::max(t.step_ends, q.step_ends - it->second.step_ends);
        t.last_steps += q.last_steps - it->second.last_steps;
      }
    }
    prev_[q.key] = {q.bytes, q.busy_ms, std::move(routes), now_ms, q.step_ends, q.last_steps};
  }
  for (auto it = prev_.begin(); it != prev_.end();) it = live.count(it->first) ? std::next(it) : prev_.erase(it);
  for (auto& [k, t] : ticks) {
    Pair& p = pairs_[k];
    p.local = k.first;
    p.peer = k.second;
  }
  // The window rate of every pair; idle ones dropped after a minute.
  std::vector<double> active;
  for (auto it = pairs_.begin(); it != pairs_.end();) {
    Pair& p = it->second;
    auto t = ticks.find(it->first);
    p.ticks.push_back(t == ticks.end() ? Tick{} : t->second);
    p.history.push_back({p.ticks.back().bytes, p.ticks.back().busy_ms});
    while (p.history.size() > kHistory) p.history.pop_front();
    p.last.push_back({std::min(p.ticks.back().last_steps, p.ticks.back().step_ends), p.ticks.back().step_ends});
    while (p.last.size() > kLastLooks) p.last.pop_front();
    while (static_cast<int>(p.ticks.size()) > o_.window) p.ticks.pop_front();
    uint64_t bytes = 0, busy = 0;
    for (const auto& x : p.ticks) {
      bytes += x.bytes;
      busy += x.busy_ms;
    }
    p.rate = busy >= static_cast<uint64_t>(o_.min_busy_ms) && bytes > 0 ? static_cast<double>(bytes) / busy : -1;
    if (p.rate >= 0 || p.last_data_ms == 0) p.last_data_ms = now_ms;
    if (p.rate < 0 && now_ms - p.last_data_ms > 60000) {
      it = pairs_.erase(it);
      continue;
    }
    if (p.rate >= 0) active.push_back(p.rate);
    ++it;
  }
  // The routes whose probes queue now: (peer host, spine).
  queues_ = queues;
  std::set<std::pair<std::string, std::string>> queued;
  for (const auto& q : queues)
    if (q.congested) queued.insert({host_of(q.peer), q.router});
  // Each rate against the host's other pairs now, too: a guest that gets
  // less CPU for a while slows every pair of its host at once, which is
  // no fault of the fabric (with fewer than three pairs, no such measure).
  double mid = -1;
  if (active.size() >= 3) {
    std::nth_element(active.begin(), active.begin() + active.size() / 2, active.end());
    mid = active[active.size() / 2];
  }
  auto median = [](const std::deque<double>& d) {
    std::vector<double> v(d.begin(), d.end());
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  for (auto& [k, p] : pairs_) {
    if (p.rate < 0) {
      p.below = p.above = 0;
      if (now_ms - p.last_data_ms > 10000) p.slow = false;  // idle: nothing to say of it
      continue;
    }
    const double rel = mid > 0 ? p.rate / mid : -1;
    const bool ready = p.based >= o_.warmup;
    // Slow: below the mark against its own baseline and, where there is
    // one, against the host's pairs now; healthy again above the other
    // mark against its own baseline (the host's pairs may all be slow).
    // ... or where the probes on the pair's own route queue: then it is the
    // route, whichever of the host's pairs it holds back.
    bool route_queued = false;
    for (const auto& r : window_routes(p))
      route_queued |= queued.count({host_of(p.peer), r}) > 0;
    const bool low = ready && p.rate < o_.slow * p.base &&
                     (rel < 0 || p.rel_past.empty() || rel < o_.slow * p.rel_base || route_queued);
    const bool high = !ready || p.rate >= o_.healthy * p.base;
    p.raw_below = ready && p.rate < o_.slow * p.base ? p.raw_below + 1 : 0;
    if (low) {
      p.above = 0;
      if (++p.below >= o_.confirm) p.slow = true;
    } else if (high) {
      p.below = 0;
      if (++p.above >= o_.confirm) p.slow = false;
    } else {
      p.below = p.above = 0;
    }
    if (p.raw_below > 0) continue;  // no baseline from a low window, even one not called slow yet
    // The baselines: medians of the pair's recent window rates while it was
    // not slow (a mean is dragged by one window of a starved guest).
    if (!p.slow && p.below == 0) {
      p.past.push_back(p.rate);
      while (p.past.size() > kPast) p.past.pop_front();
      p.base = median(p.past);
      p.based = static_cast<int>(p.past.size());
      if (rel >= 0) {
        p.rel_past.push_back(rel);
        while (p.rel_past.size() > kPast) p.rel_past.pop_front();
        p.rel_base = median(p.rel_past);
      }
    }
  }
  // Every pair of this host low for long: not a moment short of CPU but
  // this host itself (a process hogging it, its NIC, its PCIe link).
  int ready_n = 0, long_low = 0;
  for (const auto& [k, p] : pairs_) {
    if (p.rate < 0 || p.based < o_.warmup) continue;
    ready_n++;
    long_low += p.raw_below >= o_.host_confirm;
  }
  // Not while a route queues: then the fabric slows this host's pairs.
  bool any_queued = false;
  for (const auto& q : queues) any_queued |= q.congested;
  host_wide_ = ready_n >= 2 && long_low == ready_n && !any_queued;
  if (host_wide_)
    for (auto& [k, p] : pairs_)
      if (p.rate >= 0 && p.based >= o_.warmup) p.slow = true;
  blame(now_ms, queues);
}

namespace {
struct Cand {
  std::string kind, name;  // kind: link, host, path
  std::string a, b;        // link: the rail's address and the spine; host: the host; path: local, peer
  std::set<const void*> members;
  int slow = 0;   // slow pairs through it
  int named = 0;  // those, and (links) pairs whose probes through it queue
  bool queued = false;     // probes on its routes queue (links) / on any route of it (hosts)
};

}  // namespace

void Diagnoser::blame(int64_t now_ms, const std::vector<RouteQueue>& queues) {
  std::map<std::string, Cand> cands;
  int slow_n = 0;
  bool confirmed = false;
  // A pair counts against a cause while below the slow mark now, confirmed
  // or not: pairs slowed by one fault cross it a look or two apart, and
  // the first alone would be blamed on its own path.
  auto suspect = [&](const Pair& p) {
    return p.slow || (p.rate >= 0 && p.based >= o_.warmup && p.rate < o_.slow * p.base);
  };
  std::map<std::string, std::set<std::string>> queued_to;  // spine -> the hosts its probes queue towards
  for (const auto& q : queues)
    if (q.congested) queued_to[q.router].insert(host_of(q.peer));
  auto add = [&](const std::string& kind, const std::string& a, const std::string& b, const Pair& p) {
    std::string name = kind == "link" ? a + " ~ " + b : kind == "host" ? a : a + " -> " + b;
    Cand& c = cands[kind + " " + name];
    c.kind = kind;
    c.name = name;
    c.a = a;
    c.b = b;
    if (!c.members.insert(&p).second) return;
    if (suspect(p)) {
      c.slow++;
      c.named++;
    } else if (kind == "link" && queued_to.count(b) && queued_to[b].count(host_of(p.peer))) {
      c.named++;  // not slow yet, but its own route through that spine queues
    }
  };
  for (const auto& [k, p] : pairs_) {
    if (p.based < o_.warmup || (p.rate < 0 && !p.slow)) continue;
    slow_n += suspect(p);
    confirmed |= p.slow;
    // Which end of its route: probes through one spine that queue towards
    // two hosts or more say this host's own uplink to it; towards one
    // host alone, that host's link from the spine; no queue, either.
    for (const auto& r : window_routes(p)) {
      add("link", p.local, r, p);
      auto q = queued_to.find(r);
      if (q == queued_to.end() || q->second.size() < 2) add("link", p.peer, r, p);
    }
    add("host", host_of(p.peer), "", p);
    // This host only once every pair of it has been low for long (below):
    // as a catch-all it would outscore the link that slows most of them.
    if (host_wide_) add("host", host_of(p.local), "", p);
    add("path", p.local, p.peer, p);
  }
  // Probe evidence. A link: the probes through its spine queue, and some
  // through another spine do not (a queue on every route is the host's).
  // A host: its routes queue all alike, or none do.
  std::set<std::string> locals;
  for (const auto& [k, p] : pairs_) locals.insert(p.local);
  for (auto& [id, c] : cands) {
    bool here = false, elsewhere_calm = false, any = false, all = true;
    const bool far = c.kind == "link" && !locals.count(c.a);  // the link at a peer's leaf
    for (const auto& q : queues) {
      if (c.kind == "link") {
        if (far && host_of(q.peer) != host_of(c.a)) continue;
        if (q.router == c.b) here |= q.congested;
        else elsewhere_calm |= !q.congested;
      } else if (c.kind == "host" && host_of(q.peer) == c.a) {
        any |= q.congested;
        all &= q.congested;
      }
    }
    c.queued = c.kind == "link" ? here && elsewhere_calm : any && !all;
  }
  json best;
  bool evident = false;  // the cause is a link whose probes queue
  if (confirmed) {
    const Cand* top = nullptr;
    double top_score = -1;
    int top_rank = -1;
    for (const auto& [id, c] : cands) {
      if (c.slow == 0) continue;
      // (slow pairs it explains / slow pairs) x (pairs it holds back /
      // pairs through it); a link holds back, besides its slow pairs, those
      // whose probes through it queue (they are slow a look or two later).
      const double score = std::round(100.0 * std::min(1.0, static_cast<double>(c.slow) / slow_n) * c.named /
                                      static_cast<double>(c.members.size())) / 100;
      // On equal scores: a link whose probes queue there alone, then a host
      // whose routes queue alike (CPU, PCIe, NIC: not one route's fault),
      // then a link without evidence, then one path.
      const int rank = c.kind == "link" ? (c.queued ? 3 : 1) : c.kind == "host" ? (c.queued ? 1 : 2) : 0;
      if (score > top_score || (score == top_score && rank > top_rank) ||
          (score == top_score && rank == top_rank && top && c.members.size() < top->members.size())) {
        top = &c;
        top_score = score;
        top_rank = rank;
      }
    }
    if (top) {
      json pairs = json::array();
      double worst = 1;
      for (const auto& [k, p] : pairs_)
        if (suspect(p) && top->members.count(&p)) {
          const double f = p.rate >= 0 && p.base > 0 ? p.rate / p.base : 0;
          worst = std::min(worst, f);
          const double ls = last_share(p);
          pairs.push_back({{"local", p.local},
                           {"peer", p.peer},
                           {"factor", std::round(f * 100) / 100},
                           {"last_share", ls >= 0 ? json(std::round(ls * 100) / 100) : json(nullptr)}});
        }
      std::string evidence = top->kind == "link"
                                 ? (top->queued ? "probes through this spine queue" : "no probe queueing seen")
                             : top->kind == "host"
                                 ? (top->queued ? "some of its routes queue" : "its routes queue alike or not at all: CPU, PCIe or NIC")
                                 : "one pair alone";
      // One slow pair with no probe evidence is also what a moment's stall
      // of one guest looks like: low, whatever its score (the job-wide view
      // counts it only where another host names the same place).
      evident = top->kind == "link" && top->queued;
      const bool lone = pairs.size() < 2 && !evident;
      const double conf = lone ? 0.3 : top_score * (top_rank >= 2 ? 1.0 : 0.7);
      best = {{"cause", top->kind},
              {"name", top->name},
              {"score", top_score},
              {"confidence", conf >= 0.8 ? "high" : conf >= 0.5 ? "medium" : "low"},
              {"evidence", evidence},
              {"slow_pairs", slow_n},
              {"crossing_pairs", top->members.size()},
              {"worst_factor", std::round(worst * 100) / 100},
              {"pairs", pairs}};
      if (top->kind == "link") best["link"] = {top->a, top->b};
      // Where it is: the host's addresses (a link is at its host's leaf),
      // so that several hosts' names of one place can be told as one.
      json at = json::array();
      if (top->kind == "link") {
        at.push_back(top->a);
      } else if (top->kind == "host") {
        for (const auto& [addr, name] : hosts_)
          if (name == top->a) at.push_back(addr);
        if (at.empty()) at.push_back(top->a);
      } else {
        at.push_back(top->b);
      }
      best["at"] = at;
    }
  }
  const std::string was = current_.is_object() ? current_.value("cause", "") + " " + current_.value("name", "") : "";
  const std::string now = best.is_object() ? best.value("cause", "") + " " + best.value("name", "") : "";
  // Another cause is adopted once it was the best at `settle` looks in a
  // row (an end at once: the pairs' own hysteresis already held it).
  // A pending cause may change its factors from look to look; its name
  // is what must hold.
  if (now != was && !now.empty()) {
    pending_n_ = now == pending_ ? pending_n_ + 1 : 1;
    pending_ = now;
    // A link that its probes show queueing needs one look less: that
    // evidence does not come and go with a guest's CPU.
    // One slow pair with no probe evidence (a peer named by the one pair
    // this host has to it) is what a guest's moment short of CPU looks
    // like too: it must hold twice as long.
    const bool lone = best["pairs"].size() < 2;
    const int need = evident ? o_.settle - 1 : lone ? 2 * o_.settle : o_.settle;
    if (pending_n_ < need) return;  // the cause in force (or none) stays until then
  }
  pending_.clear();
  pending_n_ = 0;
  if (was != now) {
    if (!was.empty())
      changes_.push_back({{"event", "slowdown_end"},
                          {"cause", current_["cause"]},
                          {"name", current_["name"]},
                          {"lasted_ms", now_ms - current_.value("since_ms", now_ms)}});
    if (!now.empty()) {
      best["since_ms"] = now_ms;
      json c = best;
      c["event"] = "slowdown";
      changes_.push_back(c);
    }
  } else if (best.is_object()) {
    best["since_ms"] = current_.value("since_ms", now_ms);
  }
  current_ = best;
}

json Diagnoser::view() const {
  json pairs = json::array();
  bool warming = true;  // until some pair has a baseline
  for (const auto& [k, p] : pairs_) {
    if (p.based >= o_.warmup) warming = false;
    pairs.push_back({{"local", p.local},
                     {"peer", p.peer},
                     {"rate_Bps", p.rate >= 0 ? json(std::round(p.rate * 1000)) : json(nullptr)},
                     {"baseline_Bps", p.based ? json(std::round(p.base * 1000)) : json(nullptr)},
                     {"factor", p.rate >= 0 && p.base > 0 && p.based >= o_.warmup ? json(std::round(p.rate / p.base * 100) / 100)
                                                                                 : json(nullptr)},
                     {"slow", p.slow},
                     {"last_share", last_share(p) >= 0 ? json(std::round(last_share(p) * 100) / 100) : json(nullptr)},
                     {"routes", window_routes(p)},
                     {"history", p.history}});
  }
  json qs = json::array();
  for (const auto& q : queues_)
    qs.push_back({{"peer", q.peer}, {"router", q.router}, {"excess_ms", std::round(q.excess_ns / 1e4) / 100},
                  {"congested", q.congested}});
  return {{"state", current_.is_object() ? "slow" : warming ? "warming up" : "healthy"},
          {"queues", qs},
          {"slowdown", current_},
          {"pairs", pairs},
          {"at_ms", now_ms_}};
}

std::vector<json> Diagnoser::take_changes() {
  std::vector<json> out;
  out.swap(changes_);
  return out;
}

std::vector<BundlePath> bundle_paths_of(const json& b) {
  std::vector<BundlePath> out;
  if (!b.is_object() || !b.contains("primary") || !b["primary"].is_object()) return out;
  auto one = [&](const json& p) {
    if (!p.is_object()) return;
    const json& sp = p.value("udp_sport", json());
    out.push_back({p.value("router", ""), p.value("bytes", uint64_t{0}),
                   sp.is_number_unsigned() ? static_cast<int>(sp.get<uint16_t>()) : -1});
  };
  one(b["primary"]);
  if (b.contains("paths") && b["paths"].is_array())
    for (const auto& p : b["paths"]) one(p);
  return out;
}

std::vector<QpLook> qp_looks(const json& members, const std::string& skip) {
  std::vector<QpLook> out;
  if (!members.is_object()) return out;
  for (const auto& [pid, m] : members.items()) {
    if (pid == skip || !m.is_object() || m.value("final", false)) continue;
    auto v = m.find("verbs");
    if (v == m.end() || !v->is_object() || !v->contains("qps") || !(*v)["qps"].is_array()) continue;
    for (const auto& q : (*v)["qps"]) {
      if (!q.is_object() || q.value("destroyed", false) || q.contains("shadow_of")) continue;
      if (!q.value("peer", json()).is_string() || !q.value("local", json()).is_string()) continue;
      QpLook l;
      l.key = pid + "/" + q.value("device", "") + "/" + std::to_string(q.value("qpn", 0u));
      l.local = q["local"].get<std::string>();
      l.peer = q["peer"].get<std::string>();
      l.bytes = q.value("send_bytes", uint64_t{0});
      l.busy_ms = q.value("busy_ms", uint64_t{0});
      l.last_steps = q.value("last_steps", uint64_t{0});
      l.step_ends = v->value("step_ends", uint64_t{0});
      for (const auto& p : bundle_paths_of(q.value("bundle", json()))) l.routes.push_back({p.router, p.bytes});
      if (l.routes.empty()) l.routes.push_back({"", l.bytes});
      out.push_back(std::move(l));
    }
  }
  return out;
}

}  // namespace shunt::telemetry
