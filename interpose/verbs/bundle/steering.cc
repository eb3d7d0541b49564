// Steering: the shares of a split by the probes' queues, and a pinned bundle's carrier moved off a congested path.
#include "interpose/verbs/bundle/parts.h"

#include <fmt/format.h>

#include <cmath>

#include "core/mono.h"
#include "core/runtime.h"
#include "interpose/verbs/steer.h"

namespace shunt::verbs::bundle {

namespace {

// The forward queue of each (rail, source port) whose probes are alive and
// know it.
std::map<std::pair<int, uint32_t>, json> queues_by_port(const ProbeStats& stats) {
  std::map<std::pair<int, uint32_t>, json> by_port;  // (rail, source port) -> its queue
  for (const auto& [at, p] : stats)
    if (p.value("alive", false) && p.contains("fwd_queue") && p["fwd_queue"].value("ready", false))
      by_port[at] = p["fwd_queue"];
  return by_port;
}

// Notes each path's queue on it, and lists the usable paths for the
// steering step: into sp, their indices into idx; how many know their
// queue. Under b->lk.
int steer_paths(Bundle* b, const std::map<std::pair<int, uint32_t>, json>& by_port, std::vector<SteerPath>* sp,
                std::vector<int>* idx) {
  int known = 0;
  for (size_t i = 0; i < b->paths.size(); i++) {
    Path& p = b->paths[i];
    auto it = by_port.find({p.rail, path_sport(p)});
    p.queue_known = it != by_port.end();
    if (p.queue_known) {
      p.excess_ns = it->second.value("excess_ns", 0.0);
      p.threshold_ns = it->second.value("threshold_ns", 0.0);
      p.congested = it->second.value("congested", false);
    }
    if (!usable(p)) continue;
    SteerPath s;
    s.share = p.share;
    s.known = p.queue_known;
    s.excess_ns = p.excess_ns;
    s.threshold_ns = p.threshold_ns;
    s.congested = p.congested;
    s.prev_excess_ns = p.prev_excess_ns;
    known += s.known;
    sp->push_back(s);
    idx->push_back(static_cast<int>(i));
  }
  return known;
}

// Takes the step's shares, and marks the paths it moved shares from and to;
// their source ports into *from and *to. Under b->lk.
void take_steer(Bundle* b, const std::vector<SteerPath>& sp, const std::vector<int>& idx, const SteerResult& res,
                std::string* from, std::string* to) {
  b->steer_steps++;
  for (size_t j = 0; j < sp.size(); j++) b->paths[idx[j]].share = sp[j].share;
  auto mark = [&](const std::vector<int>& js, int dir) {
    std::string ports;
    for (int j : js) {
      Path& p = b->paths[idx[j]];
      if (p.last_move == -dir) b->steer_reversals++;
      p.last_move = dir;
      ports += (ports.empty() ? "" : ",") + std::to_string(path_sport(p));
    }
    return ports;
  };
  *from = mark(res.from, -1);
  *to = mark(res.to, 1);
}

// Each path as port:share:queue excess in us (-1 unknown), C when congested.
// Under b->lk.
std::string steer_text(Bundle* b, const std::vector<SteerPath>& sp, const std::vector<int>& idx) {
  std::string paths;
  for (size_t j = 0; j < sp.size(); j++) {
    const Path& p = b->paths[idx[j]];
    paths += fmt::format("{}{}:{:.2f}:{:.0f}{}", paths.empty() ? "" : " ", path_sport(p), p.share,
                         p.queue_known ? p.excess_ns / 1000 : -1.0, p.congested ? ":C" : "");
  }
  return paths;
}

}  // namespace

// Steering a split bundle (steer.h): from the forward queues the host
// agent's probes measure on the shadows' source ports, moves shares off
// the congested paths. From the failover worker, every
// SHUNT_STEER_INTERVAL_MS, never under the data path's lock across the
// request. A step that moved shares is an event, at most one a second per
// bundle (with the steps taken since the last one).
void steer_tick(Bundle* b, const ProbeStats& stats) {
  const auto by_port = queues_by_port(stats);
  std::string from, to, paths;
  uint64_t steps = 0;
  {
    std::lock_guard l(b->lk);
    std::vector<SteerPath> sp;
    std::vector<int> idx;
    const int known = steer_paths(b, by_port, &sp, &idx);
    b->steer_owd = known >= 2;
    if (!b->steer_owd) return;
    const int64_t t = mono_ns();
    const double interval = b->last_steer_ns ? static_cast<double>(t - b->last_steer_ns)
                                             : static_cast<double>(config().num(Param::steer_interval_ms)) * 1e6;
    b->last_steer_ns = t;
    SteerResult res = steer_step(sp, interval, b->rng);
    for (size_t j = 0; j < sp.size(); j++) b->paths[idx[j]].prev_excess_ns = sp[j].prev_excess_ns;
    if (!res.moved) return;
    take_steer(b, sp, idx, res, &from, &to);
    const int64_t now = mono_ms();
    if (now - b->last_steer_event_ms < 1000) return;
    b->last_steer_event_ms = now;
    paths = steer_text(b, sp, idx);
    steps = b->steer_steps;
  }
  event_shares_steered(b, from, to, steps, paths);
}

namespace {

// The probes' word on a source port's forward queue: 1 congested, 0 not,
// -1 not known.
int probe_verdict(const ProbeStats& stats, int rail, uint32_t sport) {
  if (!sport) return -1;
  auto it = stats.find({rail, sport});
  if (it == stats.end() || !it->second.value("alive", false) || !it->second.contains("fwd_queue")) return -1;
  const json& q = it->second["fwd_queue"];
  if (!q.value("ready", false)) return -1;
  return q.value("congested", false) ? 1 : 0;
}

// One figure of a source port's forward queue (0 where not known).
double probe_queue(const ProbeStats& stats, int rail, uint32_t sport, const char* what) {
  auto it = stats.find({rail, sport});
  return it == stats.end() ? 0.0 : it->second.value("fwd_queue", json::object()).value(what, 0.0);
}

// What a tick knows when it fills each path's view.
struct ViewAt {
  int64_t now;
  bool fresh;           // the peer's view is recent
  bool decides;         // this end decides: its echo notes the queues
  std::string crouter;  // our carrier's half's router (discovery's; "" where not known)
  int crail;
};

// Path i's view, its queue and the peer's word on it, into v; noted on the
// path, and what the other side is told into view. Under b->lk.
void fill_view(Bundle* b, const ProbeStats& stats, const ViewAt& at, CarrierView& v, int i, json& view) {
  Path& p = P(b, i);
  const int rail = i == kPrimary ? 0 : p.rail;
  const uint32_t sport = path_sport(p);
  v.path = i;
  v.usable = usable(p);
  v.own.verdict = v.usable ? probe_verdict(stats, rail, sport) : -1;
  v.own.excess_ns = probe_queue(stats, rail, sport, "excess_ns");
  v.own.threshold_ns = probe_queue(stats, rail, sport, "threshold_ns");
  v.own.same = !at.crouter.empty() && p.router == at.crouter && rail == at.crail;
  auto it = b->peer_view.find(i);
  if (at.fresh && it != b->peer_view.end()) v.peer = it->second;
  if (at.decides) {
    v.own.recent_ns = b->echo.note(at.now, i, 0, v.own);
    v.peer.recent_ns = b->echo.note(at.now, i, 1, v.peer);
  }
  p.queue_known = v.own.verdict >= 0;  // for the stats and `shuntctl paths`
  p.congested = v.own.verdict == 1;
  p.excess_ns = v.own.excess_ns;
  p.threshold_ns = v.own.threshold_ns;
  // What the other side is told: [verdict, queue us, threshold us, same router]
  if (v.usable && v.own.verdict >= 0)
    view[std::to_string(i)] = json::array({v.own.verdict, std::round(v.own.excess_ns / 1000),
                                           std::round(v.own.threshold_ns / 1000), v.own.same ? 1 : 0});
}

// The carrier's view into c, every other path's into others, and what the
// other side is told into view. Under b->lk.
void carrier_views(Bundle* b, const ProbeStats& stats, bool decides, int64_t now, CarrierView& c,
                   std::vector<CarrierView>& others, json& view) {
  const bool fresh = now - b->peer_view_ms < 3000;
  // Our carrier's half's router (discovery's; "" where not known).
  const Path& cp = P(b, b->carrier);
  const ViewAt at{now, fresh, decides, cp.router, b->carrier == kPrimary ? 0 : cp.rail};
  if (!b->prim.down()) {
    CarrierView v;
    fill_view(b, stats, at, v, kPrimary, view);
    if (b->carrier == kPrimary) c = v;
  }
  for (size_t i = 0; i < b->paths.size(); i++) {
    CarrierView v;
    fill_view(b, stats, at, v, static_cast<int>(i), view);
    if (static_cast<int>(i) == b->carrier) c = v;
    else others.push_back(v);
  }
}

// The deciding end's choice: the path to move the carrier to once the hold
// has passed, with the queues that made it in *why; else -1. Under b->lk.
int carrier_decide(Bundle* b, const CarrierView& c, const std::vector<CarrierView>& others, int64_t now, json* why) {
  const int target = b->chold.tick(now, carrier_target(c, others, b->rng), b->rng);
  if (target >= 0) {
    auto q = [&](const CarrierView& v) {
      return json{{"path", v.path}, {"queue_us", v.own.excess_ns / 1000}, {"own", carrier_congested(v.own) ? 1 : v.own.verdict},
                  {"peer", carrier_congested(v.peer) ? 1 : v.peer.verdict}, {"peer_queue_us", v.peer.excess_ns / 1000},
                  {"recent_us", v.own.recent_ns / 1000}};
    };
    json o = json::array();
    for (const auto& v : others)
      if (v.path == target) o = q(v);
    *why = {{"carrier", q(c)}, {"to", o}, {"hold_window_ms", b->chold.window_ms()}};
  }
  return target;
}

}  // namespace

// Steering a pinned bundle (steer.h): every SHUNT_STEER_INTERVAL_MS, each
// end reads its halves' forward queues (its host agent's probes of their
// source ports, the application QP's included). The other side tells the
// deciding side its own every second; the deciding side returns the path
// to move the carrier to once the hold has passed, else -1, with the
// queues that made it in *why. Never under the data path's lock across a
// request.
int carrier_steer_tick(Bundle* b, const ProbeStats& stats, bool decides, json* why) {
  const int64_t now = mono_ms();
  json view = json::object();
  {
    std::lock_guard l(b->lk);
    if (b->move != Move::idle) return -1;
    CarrierView c;
    std::vector<CarrierView> others;
    carrier_views(b, stats, decides, now, c, others, view);
    b->carrier_dir = c.own;
    if (decides) return carrier_decide(b, c, others, now, why);
    // Told every second (the queues change all the time).
    if (now - b->view_sent_ms < 1000) return -1;
    b->view_sent_ms = now;
  }
  std::string err;
  ask_peer(b, request(b, Msg::steer_view, {{"view", view}}), 1000, &err);
  return -1;
}

json answer_steer_view(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  const json& v = req.contains("view") ? req["view"] : json();
  const char* expect = "view: an object of path -> [verdict -1..1, queue us, threshold us, same router 0|1] expected";
  if (!v.is_object() || v.size() > 4096) return {{"error", expect}};
  std::map<int, CarrierDir> m;
  for (const auto& [k, x] : v.items()) {
    char* end = nullptr;
    long i = std::strtol(k.c_str(), &end, 10);
    if (end == k.c_str() || *end || i < kPrimary || i > 4096 || !x.is_array() || x.size() != 4 ||
        !x[0].is_number_integer() || x[0] < -1 || x[0] > 1 || !x[1].is_number() || x[1] < 0 || !x[2].is_number() ||
        x[2] < 0 || !x[3].is_number_integer())
      return {{"error", expect}};
    CarrierDir d;
    d.verdict = x[0].get<int>();
    d.excess_ns = x[1].get<double>() * 1000;
    d.threshold_ns = x[2].get<double>() * 1000;
    d.same = x[3].get<int>() != 0;
    m[static_cast<int>(i)] = d;
  }
  std::lock_guard l(b->lk);
  b->peer_view = std::move(m);
  b->peer_view_ms = mono_ms();
  return {{"ok", true}};
}

}  // namespace shunt::verbs::bundle
