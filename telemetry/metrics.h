// The host's metrics: every member process's latest report merged with the
// probe engine's view, as one Prometheus exposition. Pure functions of the
// JSON the agent holds, so the endpoint, the textfile, shuntctl and the
// tests all see the same numbers.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace shunt::clocksync {
class ProbeEngine;
}

namespace shunt::telemetry {

// What the host agent answers to the "telemetry" command.
struct HostView {
  nlohmann::json members = nlohmann::json::object();  // pid -> stats_json() report
  nlohmann::json peers = nlohmann::json::array();     // peers_view()
  long agent_pid = 0;
  double uptime_s = 0;
  nlohmann::json diagnosis;  // Diagnoser::view() (diagnose.h), null when none
  uint64_t exited_dropped = 0;  // exited processes no longer in members (agent::exited_dropped)
  nlohmann::json retired = nlohmann::json::array();  // their counters: fold_exited() (retired.h)
};
HostView host_view_from(const nlohmann::json& answer);
nlohmann::json host_view_json(const HostView& v);

// The probe engine's peers and paths: [{peer, clock{...}, paths[{rail,
// local, remote, alive, fwd/rev p50/p99 ns, loss, sent, received}]}]; the
// remote addresses come from SHUNT_PEERS.
nlohmann::json peers_view(const clocksync::ProbeEngine* e);

// Every path with its probe state plus the TCP bytes of member sockets
// whose two addresses are the path's two ends.
nlohmann::json paths_view(const HostView& v);

// Every path of every live bundle of the member processes, flat: [{pid,
// rank, device, qpn, path ("primary" or a shadow's index), udp_sport, up,
// carrier, tx_bytes, fails}].
nlohmann::json bundle_paths_view(const HostView& v);

std::string render_metrics(const HostView& v);

}  // namespace shunt::telemetry
