// The services every host agent runs, and the commands that expose them.
#include <arpa/inet.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "agent/agent.h"
#include "agent/agent_services.h"
#include "clocksync/engine.h"
#include "core/log.h"
#include "core/mono.h"
#include "core/roce_rails.h"
#include "core/runtime.h"
#include "core/threads.h"
#include "interpose/socket/rail_steering.h"
#include "interpose/verbs/path_discovery.h"

namespace shunt::agent {

void register_peer_service();  // peer_service.cc
void register_auto_peers(std::function<clocksync::ProbeEngine*()> engine);  // auto_peers.cc

namespace {
using nlohmann::json;

clocksync::ProbeEngine* g_engine = nullptr;  // agent thread only, once started

json queue_json(const clocksync::CongestionState& q) {
  return {{"ready", q.samples >= clocksync::CongestionDetector::kWarmup}, {"samples", q.samples},
          {"base_ns", q.base_ns},           {"level_ns", q.level_ns},   {"excess_ns", q.excess_ns},
          {"threshold_ns", q.threshold_ns}, {"congested", q.congested}, {"changes", q.changes}};
}

json path_json(const clocksync::PathStats& p) {
  return {{"alive", p.alive},         {"fwd_p50_ns", p.fwd_p50_ns}, {"fwd_p99_ns", p.fwd_p99_ns},
          {"rev_p50_ns", p.rev_p50_ns}, {"rev_p99_ns", p.rev_p99_ns}, {"fwd_loss", p.fwd_loss},
          {"rev_loss", p.rev_loss},     {"sent", p.sent},             {"received", p.received},
          {"fwd_queue", queue_json(p.fwd_queue)}};
}

json peers_json() {
  json out = json::array();
  if (!g_engine) return out;
  for (const auto& r : g_engine->report()) {
    json paths = json::array();
    for (size_t i = 0; i < r.paths.size(); i++) {
      json p = path_json(r.paths[i]);
      p["rail"] = i;
      paths.push_back(p);
    }
    json sps = json::array();
    for (const auto& sp : r.source_paths) {
      json p = path_json(sp.stats);
      p["rail"] = sp.rail;
      p["port"] = sp.port;
      p["reflected"] = sp.reflected;
      p["spare"] = sp.spare;
      sps.push_back(p);
    }
    out.push_back({{"peer", r.name},
                   {"source_paths", sps},
                   {"clock", {{"valid", r.clock.valid}, {"offset_ns", r.clock.offset_ns},
                              {"bound_ns", r.clock.bound_ns}, {"drift_ppb", r.clock.drift_ppb},
                              {"age_ns", r.clock.age_ns}}},
                   {"paths", paths}});
  }
  return out;
}

// Source paths of verbs bundles: a process asks for probes from each shadow
// QP's UDP source port to the bundle's peer, asks again with the new list
// when shadows were renewed on new ports, and drops them when the QP goes.
// Keyed by the bundle ("GID-QPN" of the application's QP).
// (Built on first use and never destroyed, like bundle_spares() below: the
// agent's thread may still serve a request while the application's exit()
// runs the static destructors.)
std::map<std::string, std::vector<int>>& bundle_paths() {  // agent thread only
  static auto* m = new std::map<std::string, std::vector<int>>;
  return *m;
}
// Bundles of a host towards one peer share source ports (path discovery
// serves them the same ports), and a port can be bound once: such bundles
// share the source path, which goes when the last of them lets it go.
struct SharedPath {
  std::string peer;
  int rail = 0;
  uint16_t port = 0;
  int refs = 0;
};
std::map<int, SharedPath>& shared_paths() {  // by source path id; agent thread only
  static auto* m = new std::map<int, SharedPath>;
  return *m;
}
// The ids each bundle calls spare ("spares": ports that carry nothing now);
// a path shared by bundles is probed as a spare only while every one of
// them calls it that.
std::map<std::string, std::set<int>>& bundle_spares() {  // agent thread only; built on first use
  static auto* m = new std::map<std::string, std::set<int>>;
  return *m;
}

void apply_spares(const std::vector<int>& ids) {
  for (int id : ids) {
    bool spare = true;
    for (const auto& [key, held] : bundle_paths())
      if (std::find(held.begin(), held.end(), id) != held.end()) spare &= bundle_spares()[key].count(id) > 0;
    g_engine->set_source_path_spare(id, spare);
  }
}

int take_source_path(const std::string& peer, int rail, uint16_t port, std::string* err) {
  for (auto& [id, sp] : shared_paths())
    if (sp.peer == peer && sp.rail == rail && sp.port == port) {
      sp.refs++;
      return id;
    }
  int id = g_engine->add_source_path(peer, rail, port, err);
  if (id > 0) shared_paths()[id] = {peer, rail, port, 1};
  return id;
}

void let_go(int id) {
  auto it = shared_paths().find(id);
  if (it != shared_paths().end() && --it->second.refs > 0) return;
  if (it != shared_paths().end()) shared_paths().erase(it);
  g_engine->remove_source_path(id);
}

json add_bundle_paths(const json& req) {
  if (!g_engine) return {{"error", "no probe engine (no rails: SHUNT_PROBE_ADDRS, or no RoCE port; or no SHUNT_JOB_KEY)"}};
  const std::string peer = req.value("peer", ""), local = req.value("local", ""), key = req.value("key", "");
  const auto& locals = g_engine->config().local_addrs;
  int rail = -1;
  for (size_t i = 0; i < locals.size(); i++)
    if (locals[i] == local) rail = static_cast<int>(i);
  if (rail < 0) return {{"error", local + " is not one of the probe engine's rails"}};
  if (key.empty()) return {{"error", "no bundle key"}};
  // A bundle already known: its paths were renewed (new source ports).
  // Those still listed keep their probes and what they learned; the others
  // go, the new ones come.
  std::vector<int> kept;
  std::vector<uint16_t> have;
  if (auto it = bundle_paths().find(key); it != bundle_paths().end()) {
    std::vector<uint16_t> want;
    for (const auto& sp : req.value("sports", json::array())) want.push_back(sp.get<uint16_t>());
    for (int id : it->second) {
      auto sp = g_engine->source_path(id);
      if (sp && sp->rail == rail && std::find(want.begin(), want.end(), sp->port) != want.end()) {
        kept.push_back(id);
        have.push_back(sp->port);
      } else {
        let_go(id);
      }
    }
  }
  // Merges into a peer already known at that address. A path on another
  // rail names the peer's address on the application's NIC too (`via`): the
  // same host, known by that address, gets this rail's address.
  const std::string via = rail ? req.value("via", "") : "";
  clocksync::PeerSpec spec;
  spec.name = via.empty() ? peer : via;
  spec.by_address = true;
  spec.addrs.assign(rail + 1, "");
  spec.addrs[rail] = peer;
  if (!via.empty()) spec.addrs[0] = via;
  g_engine->add_peer(spec);
  // A peer also listed in SHUNT_PEERS goes by its own name there; then
  // add_source_path reports it unknown under its address (in "errors").
  const std::string& name = spec.name;
  std::vector<int> ids = kept;
  json errors = json::array();
  for (const auto& sp : req.value("sports", json::array())) {
    if (std::find(have.begin(), have.end(), sp.get<uint16_t>()) != have.end()) continue;
    std::string err;
    int id = take_source_path(name, rail, sp.get<uint16_t>(), &err);
    if (id > 0) ids.push_back(id);
    else errors.push_back(err);
  }
  bundle_paths()[key] = ids;
  std::set<uint16_t> spare_ports;
  for (const auto& sp : req.value("spares", json::array())) spare_ports.insert(sp.get<uint16_t>());
  std::set<int>& spares = bundle_spares()[key];
  spares.clear();
  for (int id : ids)
    if (auto sp = g_engine->source_path(id); sp && spare_ports.count(sp->port)) spares.insert(id);
  apply_spares(ids);
  return {{"ok", true}, {"paths", ids.size()}, {"errors", errors}};
}

json drop_bundle_paths(const json& req) {
  auto it = bundle_paths().find(req.value("key", ""));
  if (it == bundle_paths().end()) return {{"ok", false}};
  std::vector<int> ids = it->second;
  bundle_paths().erase(it);
  bundle_spares().erase(req.value("key", ""));
  if (g_engine) {
    for (int id : ids) let_go(id);
    apply_spares(ids);  // those still shared: the others' word alone
  }
  return {{"ok", true}};
}

// What the probes say of a bundle's source paths now: liveness and the
// forward queue of each (by source port), for the bundle's steering.
json bundle_paths_stats(const json& req) {
  auto it = bundle_paths().find(req.value("key", ""));
  if (!g_engine || it == bundle_paths().end()) return {{"error", "no such bundle's paths"}};
  json out = json::array();
  for (int id : it->second) {
    auto sp = g_engine->source_path(id);
    if (sp)
      out.push_back({{"port", sp->port},
                     {"alive", sp->stats.alive},
                     {"spare", sp->spare},
                     {"fwd_queue", queue_json(sp->stats.fwd_queue)}});
  }
  return {{"ok", true}, {"paths", out}};
}

// Path discovery for the host's bundles (see HopCache): {"local", "peer",
// "candidates", "wait_ms"} -> {"ports", "hops"} once known, {"pending": true}
// while the datagrams are out, {"busy": true} while as many discoveries as
// the cache allows are (ask again). A discovery runs in a thread of its
// own, so the agent keeps answering meanwhile.
std::atomic<int> g_hop_wait_ms{100};
verbs::HopCache& hop_cache() {
  static auto* c = new verbs::HopCache(
      [](const std::string& l, const std::string& p, const std::vector<uint16_t>& ports) {
        return verbs::hops_of_ports(l, p, ports, 2, g_hop_wait_ms.load());
      },
      [](std::function<void()> work) {
        auto round = [work] {
          ReentryGuard guard;  // its sockets are shunt's, not the application's
          pthread_setname_np(pthread_self(), "shunt-hops");
          work();
        };
        if (!start_thread("path discovery", round)) work();  // no thread: the round runs here
      },
      60'000);
  return *c;
}

// A dotted-quad IPv4 address as inet_ntop writes it: anything else would be
// a cache entry of its own for the same address, or no address at all.
bool ipv4_text(const json& v) {
  if (!v.is_string() || v.get_ref<const std::string&>().size() >= INET_ADDRSTRLEN) return false;
  const std::string& s = v.get_ref<const std::string&>();
  in_addr a;
  char back[INET_ADDRSTRLEN];
  return inet_pton(AF_INET, s.c_str(), &a) == 1 && inet_ntop(AF_INET, &a, back, sizeof back) && s == back;
}

json route_hops(const json& req) {
  const json none;
  const json& l = req.contains("local") ? req["local"] : none;
  const json& p = req.contains("peer") ? req["peer"] : none;
  if (!ipv4_text(l) || !ipv4_text(p)) return {{"error", "route-hops needs local and peer IPv4 addresses"}};
  const std::string local = l.get<std::string>(), peer = p.get<std::string>();
  const int n = req.value("candidates", 0), wait = req.value("wait_ms", 100);
  if (n < 1 || n > 256 || wait < 1 || wait > 5000)
    return {{"error", "route-hops needs candidates (1..256) and wait_ms (1..5000)"}};
  g_hop_wait_ms = wait;
  bool busy = false;
  auto e = hop_cache().get(local, peer, n, mono_ms(), &busy);
  if (busy) return {{"busy", true}};
  if (!e) return {{"pending", true}};
  return {{"ports", e->ports}, {"hops", e->hops}, {"age_ms", mono_ms() - e->at_ms}};
}

// `shuntctl probing`: pauses of the probe engine at wall-clock times
// (ProbeEngine::pause_probing), for every host of a job to pause together
// and the cost of probing to be read off the job's own throughput, with
// probing on and paused in turns. {"pause_ms": 1..600000, "at_unix_ms":
// from 1 s ago to 10 min ahead (default now), "every_ms" and "count":
// optional, that many pauses that far apart}, {"resume": true} to end
// them; with neither, the schedule in force. The answer: the schedule
// ("pause": null when none) in the host's wall-clock ms.
json probing_command(const json& req) {
  if (!g_engine) return {{"error", "no probe engine (no rails: SHUNT_PROBE_ADDRS, or no RoCE port; or no SHUNT_JOB_KEY)"}};
  const int64_t real = clocksync::TimeSource::kernel_now(), local = g_engine->time().now();
  const int64_t now_ms = real / 1'000'000, margin_ms = clocksync::ProbeEngine::kPauseMargin / 1'000'000;
  auto integer = [&](const char* name, int64_t dflt, int64_t lo, int64_t hi, int64_t* out) -> std::string {
    const json v = req.value(name, json(dflt));
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      return std::string(name) + " must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
    *out = v.get<int64_t>();
    return "";
  };
  if (req.value("resume", false)) {
    g_engine->pause_probing(0, 0);
  } else if (req.contains("pause_ms")) {
    int64_t len = 0, at = 0, count = 0, every = 0;
    std::string why = integer("pause_ms", 0, 1, 600'000, &len);
    if (why.empty()) why = integer("at_unix_ms", now_ms, now_ms - 1000, now_ms + 600'000, &at);
    if (why.empty()) why = integer("count", 1, 1, 10'000, &count);
    if (why.empty() && count > 1) why = integer("every_ms", 0, len + 2 * margin_ms, 3'600'000, &every);
    if (!why.empty())
      return {{"error", why + " (at_unix_ms: this host's clock, now " + std::to_string(now_ms) +
                            "; every_ms leaves the margin of " + std::to_string(margin_ms) +
                            " ms on each side of a pause)"}};
    const int64_t from = local + (at * 1'000'000 - real);
    g_engine->pause_probing(from, from + len * 1'000'000, every * 1'000'000, int(count));
  }
  const auto p = g_engine->probing_pause();
  if (p.until <= p.from) return {{"pause", nullptr}};
  // To the nearest ms: local and real are read a few ns apart.
  auto unix_ms = [&](int64_t t) { return (t - local + real + 500'000) / 1'000'000; };
  return {{"pause",
           {{"from_unix_ms", unix_ms(p.from)},
            {"until_unix_ms", unix_ms(p.until)},
            {"every_ms", p.every / 1'000'000},
            {"count", p.count},
            {"margin_ms", margin_ms}}}};
}

// A command whose request is read with nlohmann's checked accessors: a
// field of the wrong type is a malformed request.
Handler guarded(json (*fn)(const json&)) {
  return [fn](const json& r) {
    try {
      return fn(r);
    } catch (const json::exception& e) {
      return json{{"error", std::string("malformed request: ") + e.what()}};
    }
  };
}

// Whether the host probes, and why not: `peers` shows it.
struct ProbingState {
  std::vector<std::string> rails;
  std::string rails_from, why_not;
};
// Agent thread only. Built on first use, never freed: the agent may start
// from another library's constructor, before this library's own static
// initializers have run, and may still read it during exit.
ProbingState& probing_state() {
  static auto* s = new ProbingState;
  return *s;
}

void start_probe_engine() {
  const Config& c = config();
  const ProbeRails rails = probe_rails(c);
  const ProbePlan plan = probe_plan(rails, !c.str(Param::job_key).empty());
  probing_state() = {rails.addrs, rails_from_text(rails.from), plan.message};
  if (!plan.message.empty()) log::at(plan.level, "probe engine: {}", plan.message);
  if (!plan.start) return;
  clocksync::EngineConfig ec;
  std::vector<clocksync::PeerSpec> peers;
  std::string err;
  if (!clocksync::engine_config_from(c, &ec, &peers, &err)) {
    log::error("probe engine: {}", err);
    probing_state().why_not = err;
    return;
  }
  ec.local_addrs = rails.addrs;
  auto* e = new clocksync::ProbeEngine(ec);
  for (auto& p : peers) e->add_peer(p);
  if (!e->start(&err)) {
    log::error("probe engine: {}", err);
    probing_state().why_not = err;
    delete e;
    return;
  }
  g_engine = e;
  std::string list;
  for (const auto& a : ec.local_addrs) list += (list.empty() ? "" : ",") + a;
  log::info("probe engine: {} rails ({}: {}), {} peers", ec.local_addrs.size(), probing_state().rails_from, list,
            peers.size());
}

// The sockets service (interpose/socket/rail_steering.h), registered as
// the agent's: its "sockets" command, its report listener, then itself.
Service rail_service(std::function<clocksync::ProbeEngine*()> engine) {
  sock::RailService r = sock::rail_service(std::move(engine));
  register_command("sockets", [sockets = r.sockets](const json&) { return sockets(); });
  on_report(r.on_report);
  return {"mptcp-rails", r.start, r.stop};
}

json probing_json() {
  return {{"running", g_engine != nullptr},
          {"rails", probing_state().rails},
          {"rails_from", probing_state().rails_from},
          {"why_not", probing_state().why_not}};
}
}  // namespace

void register_builtin_services() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_service({"probe-engine", start_probe_engine, [] {
                        if (g_engine) g_engine->stop();
                      }});
    register_command("peers", [](const json&) { return json{{"peers", peers_json()}, {"probing", probing_json()}}; });
    register_command("bundle-paths", guarded(add_bundle_paths), Access::control);
    register_command("bundle-paths-drop", drop_bundle_paths, Access::control);
    register_command("route-hops", guarded(route_hops));
    register_command("bundle-paths-stats", bundle_paths_stats);
    register_command("probing", guarded(probing_command), Access::control);
    register_auto_peers([] { return g_engine; });
    register_service(rail_service([] { return g_engine; }));
    telemetry::register_agent_services([] { return g_engine; });
    register_peer_service();
  });
}

}  // namespace shunt::agent
