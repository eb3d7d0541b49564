// The services every host agent runs, and the commands that expose them.
#include <mutex>

#include "clocksync/engine.h"
#include "interpose/core/log.h"
#include "interpose/core/runtime.h"
#include "interpose/peer/agent.h"
#include "interpose/socket/rail_steering.h"
#include "telemetry/agent_services.h"

namespace shunt::agent {

void register_peer_service();  // peer_service.cc
void register_auto_peers(std::function<clocksync::ProbeEngine*()> engine);  // auto_peers.cc

namespace {
using nlohmann::json;

clocksync::ProbeEngine* g_engine = nullptr;  // agent thread only, once started

json path_json(const clocksync::PathStats& p) {
  return {{"alive", p.alive},         {"fwd_p50_ns", p.fwd_p50_ns}, {"fwd_p99_ns", p.fwd_p99_ns},
          {"rev_p50_ns", p.rev_p50_ns}, {"rev_p99_ns", p.rev_p99_ns}, {"fwd_loss", p.fwd_loss},
          {"rev_loss", p.rev_loss},     {"sent", p.sent},             {"received", p.received}};
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
    out.push_back({{"peer", r.name},
                   {"clock", {{"valid", r.clock.valid}, {"offset_ns", r.clock.offset_ns},
                              {"bound_ns", r.clock.bound_ns}, {"drift_ppb", r.clock.drift_ppb},
                              {"age_ns", r.clock.age_ns}}},
                   {"paths", paths}});
  }
  return out;
}

void start_probe_engine() {
  const Config& c = config();
  if (c.str(Param::probe_addrs).empty()) return;  // no rails named: nothing to probe
  clocksync::EngineConfig ec;
  std::vector<clocksync::PeerSpec> peers;
  std::string err;
  if (!clocksync::engine_config_from(c, &ec, &peers, &err)) {
    log::error("probe engine: {}", err);
    return;
  }
  auto* e = new clocksync::ProbeEngine(ec);
  for (auto& p : peers) e->add_peer(p);
  if (!e->start(&err)) {
    log::error("probe engine: {}", err);
    delete e;
    return;
  }
  g_engine = e;
  log::info("probe engine: {} rails, {} peers", ec.local_addrs.size(), peers.size());
}
}  // namespace

void register_builtin_services() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_service({"probe-engine", start_probe_engine, [] {
                        if (g_engine) g_engine->stop();
                      }});
    register_command("peers", [](const json&) { return json{{"peers", peers_json()}}; });
    register_auto_peers([] { return g_engine; });
    register_service(sock::rail_service([] { return g_engine; }));
    telemetry::register_agent_services([] { return g_engine; });
    register_peer_service();
  });
}

}  // namespace shunt::agent
